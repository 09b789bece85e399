//! Kernel names for people: Itanium-mangled names (`_Z…`, as `cuFuncGetName` returns C++
//! kernels) demangled; anything else (`nvjet_sm90_…`, Triton kernels) kept as it is.

/// The demangled name, or `name` itself when it is not a mangled C++ name.
pub fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") {
        return name.to_string();
    }
    match cpp_demangle::Symbol::new(name) {
        Ok(sym) => sym
            .demangle(&cpp_demangle::DemangleOptions::default())
            .unwrap_or_else(|_| name.to_string()),
        Err(_) => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn demangles_cpp_and_keeps_the_rest() {
        assert_eq!(demangle("_Z6squarePfS_i"), "square(float*, float*, int)");
        assert_eq!(
            demangle(
                "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
            ),
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, (unsigned long)1> >(int, at::native::FillFunctor<float>, std::array<char*, (unsigned long)1>)"
        );
        assert_eq!(
            demangle("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"),
            "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
        );
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }
}

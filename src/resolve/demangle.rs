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

/// The parameter types of a demangled function signature (`void k<…>(A, B<C, D>, int)`
/// gives `["A", "B<C, D>", "int"]`), or `None` where the name has no parameter list
/// (`nvjet_…`, Triton kernels, a name cut short).
pub fn param_types(demangled: &str) -> Option<Vec<&str>> {
    let s = demangled.trim_end();
    if !s.ends_with(')') {
        return None;
    }
    // The parameter list is the last top-level parenthesis group: walk back to its `(`.
    let bytes = s.as_bytes();
    let mut depth = 0i32;
    let mut open = None;
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            b')' | b'>' | b']' => depth += 1,
            b'(' | b'<' | b'[' => {
                depth -= 1;
                if depth == 0 {
                    if bytes[i] != b'(' {
                        return None;
                    }
                    open = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &s[open? + 1..s.len() - 1];
    if inner.trim().is_empty() || inner.trim() == "void" {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '(' | '<' | '[' | '{' => depth += 1,
            ')' | '>' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(inner[start..].trim());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{demangle, param_types};

    #[test]
    fn parameter_types_of_a_signature() {
        let name = "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, 2, 2, -2>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, long)";
        let p = param_types(name).unwrap();
        assert_eq!(p.len(), 7);
        assert_eq!(
            p[1],
            "at::cuda::detail::TensorInfo<float const, unsigned int>"
        );
        assert_eq!(p[6], "long");
        assert_eq!(
            param_types("square(float*, float*, int)").unwrap(),
            ["float*", "float*", "int"]
        );
        assert_eq!(param_types("k()").unwrap(), Vec::<&str>::new());
        assert_eq!(
            param_types("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"),
            None
        );
        // A lambda parameter: its own `(int)` is inside the braces of the closure type.
        let lambda = "void at::native::elementwise_kernel<128, 2, void f<X>(at::TensorIteratorBase&, X const&)::{lambda(int)#1}>(int, void f<X>(at::TensorIteratorBase&, X const&)::{lambda(int)#1})";
        let p = param_types(lambda).unwrap();
        assert_eq!(
            p,
            [
                "int",
                "void f<X>(at::TensorIteratorBase&, X const&)::{lambda(int)#1}"
            ]
        );
    }

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

//! Element types by name: the bytes per element of each dtype PyTorch names (as a document
//! spells it, without the `torch.` prefix), which the loader holds a tensor's `itemsize`
//! to.

/// Bytes per element of the dtype PyTorch calls `name` (`bfloat16`, `float8_e4m3fn`),
/// aliases included (`float`, `half`, `long`); `None` for a name it does not know.
pub fn itemsize(name: &str) -> Option<u32> {
    Some(match name {
        "bool" | "uint8" | "int8" | "quint8" | "qint8" | "quint4x2" | "quint2x4" | "bits8"
        | "bits1x8" | "bits2x4" | "bits4x2" | "float8_e4m3fn" | "float8_e4m3fnuz"
        | "float8_e5m2" | "float8_e5m2fnuz" | "float8_e8m0fnu" | "float4_e2m1fn_x2" => 1,
        "uint1" | "uint2" | "uint3" | "uint4" | "uint5" | "uint6" | "uint7" | "int1" | "int2"
        | "int3" | "int4" | "int5" | "int6" | "int7" => 1,
        "float16" | "half" | "bfloat16" | "int16" | "short" | "uint16" | "bits16" => 2,
        "float32" | "float" | "int32" | "int" | "uint32" | "qint32" | "complex32" | "chalf" => 4,
        "float64" | "double" | "int64" | "long" | "uint64" | "complex64" | "cfloat" => 8,
        "complex128" | "cdouble" => 16,
        _ => return None,
    })
}

/// The element sizes a dtype unknown to this build may have (a newer framework's type):
/// a power of two up to the widest PyTorch has.
pub fn plausible_itemsize(n: u32) -> bool {
    n.is_power_of_two() && n <= 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_the_fixtures_use_is_known_with_torchs_size() {
        for (name, size) in [
            ("bfloat16", 2),
            ("float32", 4),
            ("float8_e4m3fn", 1),
            ("int32", 4),
            ("int64", 8),
            ("uint8", 1),
            ("complex128", 16),
            ("bool", 1),
        ] {
            assert_eq!(itemsize(name), Some(size), "{name}");
        }
        assert_eq!(
            itemsize("torch.float32"),
            None,
            "the prefix is not part of the name"
        );
        assert_eq!(itemsize("float128"), None);
        assert!(plausible_itemsize(16) && !plausible_itemsize(3) && !plausible_itemsize(32));
    }
}

//! Tests of the format types: address hex, tensor spans and view keys, digests.

use super::*;

#[test]
fn addr_round_trips_as_hex() {
    let a = Addr(0x7f3a_0000_1000);
    let s = serde_json::to_string(&a).unwrap();
    assert_eq!(s, "\"0x7f3a00001000\"");
    assert_eq!(serde_json::from_str::<Addr>(&s).unwrap(), a);
    assert_eq!(serde_json::to_string(&Addr(0)).unwrap(), "\"0x0\"");
    assert_eq!(
        serde_json::to_string(&Addr(u64::MAX)).unwrap(),
        "\"0xffffffffffffffff\""
    );
}

#[test]
fn addr_rejects_numbers_and_bad_hex() {
    for bad in [
        "123",
        "\"123\"",
        "\"0x\"",
        "\"0xzz\"",
        "\"0x10000000000000000\"",
        // Regression: `from_str_radix` takes a sign, the schema's pattern does not.
        "\"0x+7f3400000000\"",
        "\"0x-1\"",
        "\"0X10\"",
        "\" 0x10\"",
        "\"0x10 \"",
    ] {
        assert!(serde_json::from_str::<Addr>(bad).is_err(), "{bad} parsed");
    }
}

#[test]
fn tensor_span_and_view_key() {
    let t = Tensor {
        id: TensorId(0),
        storage_base: Addr(0x1000),
        storage_nbytes: 256,
        offset: 64,
        nbytes: 32,
        shape: vec![4, 4],
        stride: vec![4, 1],
        dtype: "float16".into(),
        itemsize: 2,
        device: "cuda:0".into(),
        allocation: None,
        pool: None,
        digest: None,
        reference_digest: None,
        alloc_site: vec![],
        storage: None,
    };
    assert_eq!(t.data_ptr(), Addr(0x1040));
    assert!(t.contains(Addr(0x1040)) && t.contains(Addr(0x105f)));
    assert!(!t.contains(Addr(0x1060)) && !t.contains(Addr(0x103f)));
    let mut empty = t.clone();
    empty.nbytes = 0;
    assert!(empty.contains(Addr(0x1040)));
    assert_eq!(t.layout(), "float16[4, 4] stride [4, 1]");
}

#[test]
fn digest_algorithm() {
    assert_eq!(Digest("sum64:00ff".into()).algorithm(), "sum64");
    assert_eq!(Digest("nocolon".into()).algorithm(), "");
}

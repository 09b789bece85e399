//! Tests of format 2: both versions load to the same model, the writer's choices (offsets,
//! absent columns, names once), and errors that name the column and element.

use std::path::Path;

use serde_json::{Value, json};

use crate::codec::load::{parse_live, parse_manifest};
use crate::model::format::*;
use crate::testkit::{live, manifest};

/// The test manifest with every optional field used somewhere: grid and block, a parent,
/// an opaque node, ignored words, an unread node, digests, an allocation site, a holder,
/// and a touch that names neither tensor nor allocation.
fn rich() -> Manifest {
    let mut m = manifest();
    m.tensors[1].alloc_site = vec![Frame {
        filename: "model.py".into(),
        line: 12,
        name: "load".into(),
    }];
    m.tensors[2].digest = None;
    m.owners[1].holder = Some("Linear".into());
    let g = &mut m.graphs[0];
    g.unread.push(Unread {
        index: 9,
        node_type: "host".into(),
        reason: "host nodes hold no device address".into(),
    });
    g.nodes[0].grid = Some([132, 1, 1]);
    g.nodes[0].block = Some([256, 1, 1]);
    // In the body of a child-graph node walked first (index 0, which holds no address).
    g.nodes[0].index = 3;
    g.nodes[1].parent = Some(0);
    g.nodes[1].ignored.push(IgnoredWord {
        param: 3,
        offset: 16,
        addr: Addr(0x7f2c_0000_5000),
        reason: IgnoredReason::IndexSlot,
    });
    g.nodes.push(Node {
        index: 2,
        kind: NodeKind::Memset,
        name: "memset".into(),
        grid: None,
        block: None,
        parent: None,
        opaque: Some("no parameters".into()),
        touches: vec![],
        ignored: vec![],
    });
    m.graphs[1].nodes[0].touches.push(Touch {
        param: 2,
        offset: 0,
        addr: Addr(0x7f2c_0000_4010),
        tensor: None,
        allocation: None,
    });
    m
}

fn v2_text(m: &Manifest) -> Vec<u8> {
    serde_json::to_vec(&m.clone().in_version(2)).unwrap()
}

fn v2_value(m: &Manifest) -> Value {
    serde_json::from_slice(&v2_text(m)).unwrap()
}

fn err(v: &Value) -> String {
    parse_manifest(&serde_json::to_vec(v).unwrap(), Path::new("m.json"))
        .unwrap_err()
        .to_string()
}

#[test]
fn both_versions_load_to_the_same_model() {
    for m in [manifest(), rich()] {
        let v1 = parse_manifest(
            &serde_json::to_vec(&m.clone().in_version(1)).unwrap(),
            Path::new("v1.json"),
        )
        .unwrap();
        let v2 = parse_manifest(&v2_text(&m), Path::new("v2.json")).unwrap();
        assert_eq!(v1.format_version, 1);
        assert_eq!(v2.format_version, 2);
        assert_eq!(v1.in_version(2), v2.clone());
        assert_eq!(v2, m.clone().in_version(2));

        let mut l = live(&m, Contents::Preserved);
        l.tensors[0].reference_digest = Some(Digest("sum64:00".into()));
        l.probes[0].pool = Some(PoolId(0));
        l.probes[1].allocation = Some(AllocationId(3));
        l.probes[1].state = AllocState::Free;
        let l1 = parse_live(
            &serde_json::to_vec(&l.clone().in_version(1)).unwrap(),
            Path::new("l1.json"),
        )
        .unwrap();
        let l2 = parse_live(
            &serde_json::to_vec(&l.clone().in_version(2)).unwrap(),
            Path::new("l2.json"),
        )
        .unwrap();
        assert_eq!(l1.in_version(2), l2.clone());
        assert_eq!(l2, l.in_version(2));
    }
}

#[test]
fn new_documents_are_written_in_format_2() {
    let v: Value = serde_json::to_value(manifest()).unwrap();
    assert_eq!(v["format_version"], 2);
    assert!(v["tensors"].is_object() && v["graphs"][0]["nodes"].is_object());
    let text = String::from_utf8(serde_json::to_vec(&manifest()).unwrap()).unwrap();
    assert!(
        text.starts_with("{\"format_version\":2,\"kind\":\"manifest\","),
        "{text}"
    );
    let v: Value = serde_json::to_value(manifest().in_version(1)).unwrap();
    assert_eq!(v["format_version"], 1);
    assert!(v["tensors"].is_array());
    let e = serde_json::to_vec(&manifest().in_version(7)).unwrap_err();
    assert!(
        e.to_string().contains("cannot write format_version 7"),
        "{e}"
    );
}

#[test]
fn touches_are_offsets_from_what_they_name_and_names_are_stored_once() {
    let v = v2_value(&rich());
    // bs1: the weight at its first element, graph-pool scratch 0x40 into its allocation;
    // then node 1's kv-pool buffer; node 2 (a memset) has none.
    assert_eq!(
        v["graphs"][0]["nodes"]["touches"],
        json!([
            [[0, 8, 0, 0, 0], [0, 8, 64, null, 3]],
            [[0, 8, 0, 2, 2]],
            []
        ])
    );
    // bs8: 0x10 into the plain attribute; allocation 4's base; an address alone.
    assert_eq!(
        v["graphs"][1]["nodes"]["touches"],
        json!([[
            [0, 8, 16, 1, 1],
            [0, 8, 0, null, 4],
            [2, 0, "0x7f2c00004010", null, null]
        ]])
    );
    assert_eq!(v["names"], json!(["k0", "k1", "memset"]));
    assert_eq!(v["graphs"][0]["nodes"]["name"], json!([0, 1, 2]));
    assert_eq!(v["graphs"][1]["nodes"]["name"], json!([0]));
    assert_eq!(
        v["graphs"][0]["nodes"]["ignored"],
        json!([[], [[3, 16, "0x7f2c00005000", "index_slot"]], []])
    );
    // Columns every record lacks are left out; those some record has are written whole.
    assert!(v["graphs"][1]["nodes"].get("launch").is_none());
    assert!(v["graphs"][1]["nodes"].get("ignored").is_none());
    assert_eq!(v["launches"], json!([[[132, 1, 1], [256, 1, 1]]]));
    assert_eq!(v["graphs"][0]["nodes"]["launch"], json!([0, null, null]));
    assert!(v["tensors"].get("reference_digest").is_none());
    assert_eq!(v["owners"]["holder"], json!([null, "Linear", null, null]));
    // A node-less graph has empty columns.
    let mut m = manifest();
    m.graphs[1].nodes.clear();
    let v = v2_value(&m);
    assert_eq!(
        v["graphs"][1]["nodes"],
        json!({"index": [], "kind": [], "name": []})
    );
    parse_manifest(&v2_text(&m), Path::new("m.json")).unwrap();
}

/// A touch below what it names (only an invalid document has one) is written as its
/// address, so the reader reports it where format 1 would.
#[test]
fn an_address_below_its_tensor_is_written_whole_and_reported() {
    let mut m = manifest();
    m.graphs[0].nodes[0].touches[0].addr = Addr(0x10);
    let v = v2_value(&m);
    assert_eq!(v["graphs"][0]["nodes"]["touches"][0][0][2], "0x10");
    let e = err(&v);
    assert!(
        e.contains(
            "at `graphs[0].nodes.touches[0][0][2]`: 0x10 lies outside tensor 0 \
             (0x7f2c00000000+256) (node 0's touch 0, its `addr`)"
        ),
        "{e}"
    );
}

#[test]
fn reference_errors_name_the_column_and_element() {
    let m = rich();
    let touch = |g: usize, n: usize, t: usize| format!("/graphs/{g}/nodes/touches/{n}/{t}");
    let mut v = v2_value(&m);
    *v.pointer_mut(&format!("{}/3", touch(0, 1, 0))).unwrap() = 999.into();
    *v.pointer_mut(&format!("{}/2", touch(0, 1, 0))).unwrap() = "0x7f2c00002000".into();
    let e = err(&v);
    assert!(
        e.contains(
            "m.json: invalid document at `graphs[0].nodes.touches[1][0][3]`: no tensor has id \
             999 (node 1's touch 0, its `tensor`)"
        ),
        "{e}"
    );
    // An offset from a tensor that does not exist cannot be resolved: said at the tensor.
    let mut v = v2_value(&m);
    *v.pointer_mut(&format!("{}/3", touch(1, 0, 0))).unwrap() = 999.into();
    let e = err(&v);
    assert!(
        e.contains(
            "at `graphs[1].nodes.touches[0][0][3]`: no tensor has id 999 (node 0's touch 0, \
             its `tensor`)"
        ),
        "{e}"
    );
    // A repeated id leaves the other one's touches dangling, which is said first.
    let mut v = v2_value(&m);
    v["tensors"]["id"][2] = 0.into();
    let e = err(&v);
    assert!(
        e.contains("at `graphs[0].nodes.touches[1][0][3]`: no tensor has id 2"),
        "{e}"
    );
    let mut v = v2_value(&m);
    v["owners"]["path"][2] = "model.w".into();
    let e = err(&v);
    assert!(
        e.contains(
            "at `owners.path[2]`: path \"model.w\" is given twice (also by the owner at \
             position 0)"
        ),
        "{e}"
    );
    let mut v = v2_value(&m);
    v["tensors"]["nbytes"][1] = 4096.into();
    let e = err(&v);
    assert!(
        e.contains("at `tensors.nbytes[1]`: `nbytes` is 4096, but the view "),
        "{e}"
    );
    let mut v = v2_value(&m);
    v["tensors"]["storage_nbytes"][1] = 1.into();
    let e = err(&v);
    assert!(
        e.contains("at `tensors.nbytes[1]`: the view (offset 0, ")
            && e.contains("bytes) lies outside its storage of 1 byte"),
        "{e}"
    );
    let mut v = v2_value(&m);
    v["owners"]["tensor"][3] = 7.into();
    assert!(err(&v).contains("at `owners.tensor[3]`: no tensor has id 7"));
    let mut v = v2_value(&m);
    v["allocations"]["size"][0] = 0.into();
    assert!(err(&v).contains("at `allocations.size[0]`: allocation at"));
    let mut v = v2_value(&m);
    v["graphs"][1]["pool"] = 9.into();
    assert!(err(&v).contains("at `graphs[1].pool`: no pool has id 9"));

    let l = live(&m, Contents::Preserved).in_version(2);
    let live_err = |change: &dyn Fn(&mut Value)| {
        let mut v: Value = serde_json::to_value(&l).unwrap();
        change(&mut v);
        parse_live(&serde_json::to_vec(&v).unwrap(), Path::new("l.json"))
            .unwrap_err()
            .to_string()
    };
    let e = live_err(&|v| v["probes"]["pool"] = json!([null, 9, null, null, null, null]));
    assert!(e.contains("at `probes.pool[1]`: no pool has id 9"), "{e}");
    let e = live_err(&|v| v["tensors"]["id"][2] = 0.into());
    assert!(
        e.contains("at `tensors.id[2]`: two tensors claim id 0"),
        "{e}"
    );
    let e = live_err(&|v| v["probes"]["state"][0] = "gone".into());
    assert!(
        e.contains("at `probes.state[0]`: unknown variant `gone`"),
        "{e}"
    );
}

/// A change made to a document's JSON.
type Change = Box<dyn Fn(&mut Value)>;

#[test]
fn layout_errors_name_the_column_and_element() {
    let m = rich();
    let set = |pointer: &'static str, x: Value| -> Change {
        Box::new(move |v: &mut Value| *v.pointer_mut(pointer).unwrap() = x.clone())
    };
    let cases: Vec<(Change, &str)> = vec![
        (
            set("/tensors/dtype", json!(["bfloat16"])),
            "at `tensors.dtype`: 1 value, but `tensors.id` has 3: every column of a table \
             holds one value per row",
        ),
        (
            set("/graphs/0/nodes/touches", json!([[], []])),
            "at `graphs[0].nodes.touches`: 2 values, but `graphs[0].nodes.index` has 3",
        ),
        (
            set("/graphs/0/nodes/launch/0", json!(5)),
            "at `graphs[0].nodes.launch[0]`: no launch at position 5: `launches` has 1",
        ),
        (
            set("/graphs/1/nodes/name/0", json!(7)),
            "at `graphs[1].nodes.name[0]`: no name at position 7: `names` has 3",
        ),
        (
            set("/graphs/1/nodes/touches/0/2/2", json!(16)),
            "at `graphs[1].nodes.touches[0][2][2]`: the offset 16 counts from the touch's \
             tensor or allocation, but it names neither (node 0's touch 2, its `addr`)",
        ),
        (
            set("/graphs/1/nodes/touches/0/1/2", json!(u64::MAX)),
            "at `graphs[1].nodes.touches[0][1][2]`: the offset 18446744073709551615 from the \
             base of allocation 4 (0x7f2c00004000) passes the end of the address space",
        ),
        (
            set("/graphs/1/nodes/touches/0/1/4", json!(77)),
            "at `graphs[1].nodes.touches[0][1][4]`: no allocation has id 77",
        ),
        // Parse errors: serde's path is the column and element.
        (
            set("/graphs/1/nodes/touches/0/0/2", json!(-4)),
            "at `graphs[1].nodes.touches[0][0][2]`: expected an unsigned 64-bit integer or \
             a string matching `^0x[0-9a-fA-F]{1,16}$`, found the number -4",
        ),
        (
            set("/graphs/1/nodes/touches/0/0/2", json!("0x+10")),
            "at `graphs[1].nodes.touches[0][0][2]`: invalid value: string \"0x+10\"",
        ),
        (
            set("/graphs/1/nodes/touches/0/0", json!([0, 8, 16, 1])),
            "at `graphs[1].nodes.touches[0][0]`: invalid length 4, expected a touch: [param, \
             offset, addr, tensor, allocation]",
        ),
        (
            set("/graphs/1/nodes/touches/0/0", json!([0, 8, 16, 1, 1, 0])),
            "invalid length 6, expected a touch",
        ),
        (
            set("/graphs/1/nodes/touches/0/0/0", json!("zero")),
            "at `graphs[1].nodes.touches[0][0][0]`: expected an unsigned 32-bit integer, \
             found the string \"zero\"",
        ),
        (
            set("/graphs/0/nodes/ignored/1/0/3", json!("why")),
            "at `graphs[0].nodes.ignored[1][0][3]`: unknown variant `why`",
        ),
        (
            set("/tensors/shape/1/0", json!("wide")),
            "at `tensors.shape[1][0]`: expected an unsigned 64-bit integer, found the string \
             \"wide\"",
        ),
        (
            set("/owners/path/0", json!("model..w")),
            "at `owners.path[0]`",
        ),
        (
            set("/owners/registration/0", json!(3)),
            "at `owners.registration[0]`: expected one of \"parameter\"",
        ),
        (
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("names");
            }),
            "at `graphs[0].nodes.name[0]`: no name at position 0: `names` has 0",
        ),
        (
            Box::new(|v| {
                v["tensors"].as_object_mut().unwrap().remove("device");
            }),
            "at `tensors`: missing field `device`",
        ),
    ];
    for (change, want) in cases {
        let mut v = v2_value(&m);
        change(&mut v);
        let e = err(&v);
        assert!(e.contains(want), "want {want:?}\n got {e}");
        assert!(e.starts_with("m.json"), "{e}");
    }
}

/// A format 1 body under `format_version` 2 fails where the layouts differ, and the error
/// says the body is format 1's.
#[test]
fn a_format_1_body_under_version_2_is_named() {
    let mut v: Value = serde_json::to_value(manifest().in_version(1)).unwrap();
    v["format_version"] = 2.into();
    let e = err(&v);
    assert!(
        e.contains("at `allocations`: expected an object, found an array"),
        "{e}"
    );
    assert!(e.contains("the body is in format 1's layout"), "{e}");
    // And the other way: a format 2 body under 1.
    let mut v = v2_value(&manifest());
    v["format_version"] = 1.into();
    let e = err(&v);
    assert!(e.contains("at `allocations`: expected an array"), "{e}");
}

/// The version is read from the opening bytes where it leads, else from the header: key
/// order does not matter.
#[test]
fn the_version_may_come_anywhere() {
    let v = v2_value(&rich());
    let mut reordered = serde_json::Map::new();
    for (k, x) in v.as_object().unwrap().iter().rev() {
        reordered.insert(k.clone(), x.clone());
    }
    let text = serde_json::to_vec(&Value::Object(reordered)).unwrap();
    assert!(!text.starts_with(b"{\"format_version\""));
    let m = parse_manifest(&text, Path::new("m.json")).unwrap();
    assert_eq!(m, rich().in_version(2));
    let pretty = serde_json::to_vec_pretty(&v).unwrap();
    assert_eq!(parse_manifest(&pretty, Path::new("m.json")).unwrap(), m);
}

#[test]
fn locate_maps_model_paths_to_columns() {
    let at = |p: &str| {
        let e = super::locate(crate::index::refs::Invalid::at(p, "bad"));
        format!("{} | {}", e.json_path, e.message)
    };
    assert_eq!(at("tensors[4].nbytes"), "tensors.nbytes[4] | bad");
    assert_eq!(at("owners[0].path"), "owners.path[0] | bad");
    assert_eq!(at("probes[2].allocation"), "probes.allocation[2] | bad");
    assert_eq!(
        at("graphs[0].nodes[1].touches[0].tensor"),
        "graphs[0].nodes.touches[1][0][3] | bad (node 1's touch 0, its `tensor`)"
    );
    assert_eq!(
        at("graphs[0].nodes[1].ignored[2].addr"),
        "graphs[0].nodes.ignored[1][2][2] | bad (node 1's ignored word 2, its `addr`)"
    );
    assert_eq!(
        at("graphs[1].nodes[0].kind"),
        "graphs[1].nodes.kind[0] | bad"
    );
    assert_eq!(at("graphs[1].pool"), "graphs[1].pool | bad");
    assert_eq!(at("pools[1].id"), "pools[1].id | bad");
    assert_eq!(at("format_version"), "format_version | bad");
}

//! Verify's ways through a document large enough for its threads (the touch index filled
//! beside the subjects and the pair check, the subjects judged in parallel) give one
//! report: with the touch counts the loader's check made, with tables that have none
//! (counted by verify itself), and with the live snapshot's index built beforehand, as the
//! CLI builds it on the thread that loads the snapshot.

use graphcheck::check::allow::Allowlist;
use graphcheck::check::verify::{LiveIndex, verify_checked, verify_indexed};
use graphcheck::index::refs::{Tables, check_live, check_manifest};
use graphcheck_gen::bench::{BenchOpts, generate};

#[test]
fn every_way_through_verify_gives_one_report() {
    let b = generate(BenchOpts {
        touches: 60_000,
        tensors: 12_000,
        graphs: 8,
        seed: 5,
        changes: 1.0,
        format_version: 2,
    });
    let (m, l) = (&b.manifest, &b.live);
    let nodes: usize = m.graphs.iter().map(|g| g.nodes.len()).sum();
    assert!(nodes >= 4096, "{nodes} nodes: too few for verify's threads");
    let mt = check_manifest(m).unwrap();
    let lt = check_live(l).unwrap();
    assert_eq!(mt.touch_counts.len(), m.tensors.len());
    assert_eq!(
        mt.touch_counts.iter().map(|&c| c as usize).sum::<usize>(),
        m.graphs
            .iter()
            .flat_map(|g| &g.nodes)
            .flat_map(|n| &n.touches)
            .filter(|t| t.tensor.is_some())
            .count()
    );
    assert!(lt.touch_counts.is_empty());
    let allow = Allowlist::default();

    let checked = verify_checked(m, &mt, Some((l, &lt)), &allow).unwrap();
    assert!(
        checked.findings.len() > 50,
        "{} findings",
        checked.findings.len()
    );
    assert!(checked.subjects >= 4096, "{} subjects", checked.subjects);

    let uncounted = Tables {
        touch_counts: Vec::new(),
        ..mt.clone()
    };
    let recounted = verify_checked(m, &uncounted, Some((l, &lt)), &allow).unwrap();
    assert_eq!(recounted, checked);

    let index = LiveIndex::new(l);
    let indexed = verify_indexed(m, &mt, Some((l, &lt, &index)), &allow).unwrap();
    assert_eq!(indexed, checked);

    // A snapshot of another rank is refused from the thread that checks the pair.
    let mut other = l.clone();
    other.producer.rank = 1;
    other.producer.world_size = 2;
    let other_index = LiveIndex::new(&other);
    assert!(matches!(
        verify_indexed(m, &mt, Some((&other, &lt, &other_index)), &allow),
        Err(graphcheck::check::pair::PairError::Rank { .. })
    ));

    // Alone, the manifest's capture-time findings: the same through both entry points.
    let alone = verify_checked(m, &mt, None, &allow).unwrap();
    assert_eq!(verify_indexed(m, &uncounted, None, &allow).unwrap(), alone);
    assert!(!alone.findings.is_empty());
}

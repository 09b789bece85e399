//! Symbolic addresses in a report of several ranks: each finding's addresses named by its own
//! rank's manifest. A symbol (`A3+0x40`) indexes one document's allocations, and every rank
//! is a process of its own, often at the same virtual addresses as the others, so one
//! rank's manifest cannot name another rank's addresses: it would print them `?`, or as an
//! allocation of its own that merely lies at the same address.

use std::collections::BTreeMap;

use crate::check::finding::{Finding, Report};
use crate::model::format::Addr;
use crate::present::fmt::AddrFmt;
use crate::present::normalize::{Symbolizer, redact_words};

/// Each rank's [`Symbolizer`], built from that rank's manifest.
#[derive(Clone, Debug, Default)]
pub struct RankSymbolizer {
    ranks: BTreeMap<u32, Symbolizer>,
    /// For findings of no one rank (`rank_mismatch`, `unused_allow`): it knows no address.
    none: Symbolizer,
}

/// The first address a token stands for: above every address of a 57-bit virtual address
/// space, so a token is never mistaken for an address a graph captured, nor one for a token.
const TOKEN_BASE: u64 = 0xffff_0000_0000_0000;

/// The symbols of a report [`RankSymbolizer::normalize`] made, in which every address field
/// holds a token standing for the symbol its finding's rank gave it. As an [`AddrFmt`] it
/// prints a token's symbol (the table and Markdown); [`RankSymbols::redact`] puts the
/// symbols into text that prints addresses raw (the JSON).
#[derive(Clone, Debug, Default)]
pub struct RankSymbols {
    symbols: Vec<String>,
}

impl RankSymbolizer {
    /// From each rank's symbolizer (`Symbolizer::for_manifest` of the rank's manifest).
    pub fn new(ranks: impl IntoIterator<Item = (u32, Symbolizer)>) -> RankSymbolizer {
        RankSymbolizer {
            ranks: ranks.into_iter().collect(),
            none: Symbolizer::default(),
        }
    }

    /// `r` with every address of each finding, allowed ones too, named by the symbolizer of
    /// the finding's own rank: in its sentences and names as the symbol, in its address
    /// fields as a token of the returned [`RankSymbols`]. Render the report with those
    /// symbols as its [`AddrFmt`], and the JSON through [`RankSymbols::redact`].
    pub fn normalize(&self, r: &Report) -> (Report, RankSymbols) {
        let mut out = r.clone();
        let mut symbols = RankSymbols::default();
        let allowed = out.allowed.iter_mut().map(|a| &mut a.finding);
        for f in out.findings.iter_mut().chain(allowed) {
            let sym = f
                .rank
                .and_then(|rank| self.ranks.get(&rank))
                .unwrap_or(&self.none);
            for s in strings(f) {
                *s = sym.redact(s);
            }
            let kernels = f.kernels.iter_mut().map(|k| &mut k.addr);
            for a in f
                .captured_addr
                .iter_mut()
                .chain(&mut f.live_addr)
                .chain(kernels)
            {
                *a = symbols.token(sym.symbol(*a));
            }
        }
        (out, symbols)
    }
}

/// Every text of a finding that could hold an address, as `verify --normalized` of one
/// manifest redacts the whole report.
fn strings(f: &mut Finding) -> impl Iterator<Item = &mut String> {
    let Finding {
        subject,
        detail,
        dtype,
        pool,
        new_owners,
        owners,
        graphs,
        kernels,
        alloc_site,
        ..
    } = f;
    [subject, detail]
        .into_iter()
        .chain(dtype.as_mut())
        .chain(pool.as_mut())
        .chain(new_owners.iter_mut())
        .chain(owners.iter_mut().map(|o| &mut o.path))
        .chain(graphs.iter_mut())
        .chain(kernels.iter_mut().flat_map(|k| [&mut k.graph, &mut k.name]))
        .chain(
            alloc_site
                .iter_mut()
                .flat_map(|s| [&mut s.filename, &mut s.name]),
        )
}

impl RankSymbols {
    /// A token standing for `symbol`.
    fn token(&mut self, symbol: String) -> Addr {
        self.symbols.push(symbol);
        Addr(TOKEN_BASE + (self.symbols.len() - 1) as u64)
    }

    fn symbol(&self, a: Addr) -> Option<&str> {
        let i = usize::try_from(a.0.checked_sub(TOKEN_BASE)?).ok()?;
        self.symbols.get(i).map(String::as_str)
    }

    /// `text` with every token replaced by its symbol.
    pub fn redact(&self, text: &str) -> String {
        redact_words(text, |a| self.symbol(a).map(String::from))
    }
}

impl AddrFmt for RankSymbols {
    /// A token's symbol; an address that is no token of this report names nothing here.
    fn addr(&self, a: Addr) -> String {
        self.symbol(a).unwrap_or("?").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::allow::Allowlist;
    use crate::check::verify::verify;
    use crate::model::format::Contents;
    use crate::present::report::{render_json, render_table};
    use crate::testkit::{live, manifest};

    /// Guards: a finding of rank 1 is named by rank 1's manifest, though rank 0's manifest
    /// holds an allocation at the same address (two processes, one address space layout).
    #[test]
    fn each_findings_addresses_are_named_by_its_own_ranks_manifest() {
        let m = manifest();
        let l = live(&m, Contents::Preserved);
        let mut r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        r.findings.retain(|f| f.captured_addr.is_some());
        assert!(!r.findings.is_empty());
        let addr = r.findings[0].captured_addr.unwrap();
        let own = Symbolizer::for_manifest(&m);
        // Another rank's manifest: the same allocations in another canonical order.
        let mut other = m.clone();
        other.graphs.clear();
        other.owners.reverse();
        let theirs = Symbolizer::for_manifest(&other);
        assert_ne!(
            own.symbol(addr),
            theirs.symbol(addr),
            "the test needs two namings"
        );

        for f in &mut r.findings {
            f.rank = Some(1);
            f.detail = format!("{} at {addr}", f.detail);
        }
        let ranks = RankSymbolizer::new([(0, theirs), (1, own.clone())]);
        let (n, symbols) = ranks.normalize(&r);
        let want = own.symbol(addr);
        assert_eq!(symbols.addr(n.findings[0].captured_addr.unwrap()), want);
        assert!(n.findings[0].detail.ends_with(&format!(" at {want}")));
        let table = render_table(&n, &symbols);
        assert!(table.contains(&want), "{table}");
        let json = symbols.redact(&render_json(&n));
        assert!(
            json.contains(&format!("\"captured_addr\": \"{want}\"")),
            "{json}"
        );
        assert!(!json.contains("0xffff"), "{json}");
        assert!(!json.contains(&addr.to_string()), "{json}");

        // A finding of no one rank names no address.
        r.findings[0].rank = None;
        let (n, symbols) = ranks.normalize(&r);
        assert_eq!(symbols.addr(n.findings[0].captured_addr.unwrap()), "?");
    }
}

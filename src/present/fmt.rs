//! Formatting shared by the presenters: how an address is shown (raw hex, or a symbolic id,
//! see [`crate::present::normalize`]) and how a long kernel name is cut.

use crate::document::format::Addr;

/// Formats an address for display: raw hex, or a symbolic id (see [`crate::present::normalize`]).
pub trait AddrFmt {
    fn addr(&self, a: Addr) -> String;
}

/// Plain `0x…` hex.
pub struct RawAddrs;

impl AddrFmt for RawAddrs {
    fn addr(&self, a: Addr) -> String {
        a.to_string()
    }
}

/// `name`, cut to `max` characters with an ellipsis.
pub fn shorten(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        name.to_string()
    } else {
        let head: String = name.chars().take(max - 1).collect();
        format!("{head}…")
    }
}

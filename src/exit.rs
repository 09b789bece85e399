//! Process exit codes of the `graphcheck` command line: part of its public API.

/// Verified clean (warnings, such as an unused allowlist entry, do not count); explained;
/// documents equal.
pub const OK: i32 = 0;
/// `verify`: findings (an unused allowlist entry only under `--deny-unused-allow`). `diff`:
/// the documents differ. `explain`: nothing matched the query.
pub const FINDINGS: i32 = 1;
/// Bad input or usage: unreadable or invalid document or allowlist, unknown flag.
pub const BAD_INPUT: i32 = 2;

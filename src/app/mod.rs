//! The application layer: what each command does, shared by the command line and the
//! Python API and knowing neither (no clap, no Python, nothing printed): verify (`verify`:
//! a manifest, a folder of ranks, pairs), the documents of a folder (`folder`), the other
//! commands and the output formats (`commands`), rank grouping (`ranks`) and output files
//! that never harm the user's (`output`).

pub mod commands;
pub mod folder;
pub mod output;
pub mod ranks;
pub mod retarget;
pub mod verify;

//! The application layer: what each command does, shared by the command line and the
//! Python API, knowing neither: rank grouping (`ranks`) and output files that never harm
//! the user's (`output`).

pub mod output;
pub mod ranks;

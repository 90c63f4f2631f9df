//! `settle completions SHELL` and `settle man`: generated from the same
//! clap definition as the parser, so they cannot drift from the flags. The
//! Debian package ships their output (packaging/deb.sh).

use std::io::Write;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::exit::Failure;

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish (also elvish, powershell).
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn completions<C: CommandFactory>(a: CompletionsArgs) -> Result<(), Failure> {
    let mut cmd = C::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "settle", &mut out);
    write_stdout(&out)
}

pub fn man<C: CommandFactory>() -> Result<(), Failure> {
    let mut out = Vec::new();
    clap_mangen::Man::new(C::command())
        .render(&mut out)
        .map_err(|e| Failure::local(format!("rendering the man page: {e}")))?;
    write_stdout(&out)
}

fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::local(format!("writing to stdout: {e}")))
}

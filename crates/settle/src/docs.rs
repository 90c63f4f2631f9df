//! `settle completions SHELL` and `settle man`: generated from the same
//! clap definition as the parser, so they cannot drift from the flags. The
//! Debian package ships their output (packaging/deb.sh): a page per
//! command (`settle(1)`, `settle-serve(1)`, ...), because `settle(1)`
//! names them.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Command, CommandFactory};
use clap_complete::Shell;

use crate::exit::Failure;

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish (also elvish, powershell).
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Args)]
pub struct ManArgs {
    /// Write every page (settle.1, settle-serve.1, settle-claim.1, ...) into
    /// DIR, created if missing, and print their paths, instead of printing
    /// settle(1) [default: print settle(1)].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn completions<C: CommandFactory>(a: CompletionsArgs) -> Result<(), Failure> {
    let mut cmd = C::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "settle", &mut out);
    write_stdout(&out)
}

pub fn man<C: CommandFactory>(a: ManArgs) -> Result<(), Failure> {
    let pages =
        pages(C::command()).map_err(|e| Failure::local(format!("rendering the man pages: {e}")))?;
    let Some(dir) = a.dir else {
        let (_, root) = pages.into_iter().next().expect("settle(1) comes first");
        return write_stdout(&root);
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::local(format!("creating {}: {e}", dir.display())))?;
    let mut listing = String::new();
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page)
            .map_err(|e| Failure::local(format!("writing {}: {e}", path.display())))?;
        listing.push_str(&format!("{}\n", path.display()));
    }
    write_stdout(listing.as_bytes())
}

/// Every page, `settle` first, then each visible subcommand: its name
/// (`settle-serve`) and its roff.
pub fn pages(cmd: Command) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut root = cmd.disable_help_subcommand(true);
    root.build();
    let subs: Vec<Command> = root
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let names: Vec<String> = subs.iter().map(display_name).collect();
    let mut out = vec![("settle".to_string(), page(&root, &root_sections(&names))?)];
    for sub in &subs {
        let sections = sub_sections(sub);
        out.push((display_name(sub), page(sub, &sections)?));
    }
    Ok(out)
}

fn display_name(c: &Command) -> String {
    c.get_display_name().unwrap_or(c.get_name()).to_string()
}

/// clap_mangen's page without its EXTRA section (the after-help text),
/// then `sections` (title, paragraphs) in its place.
fn page(cmd: &Command, sections: &[(&str, Vec<String>)]) -> std::io::Result<Vec<u8>> {
    let cmd = cmd
        .clone()
        .after_help(None::<&str>)
        .after_long_help(None::<&str>);
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut out)?;
    for (title, paragraphs) in sections {
        out.extend_from_slice(format!(".SH \"{title}\"\n").as_bytes());
        for (i, p) in paragraphs.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b".PP\n");
            }
            out.extend_from_slice(roff_text(p).as_bytes());
            out.push(b'\n');
        }
    }
    Ok(out)
}

/// Text as roff: backslashes escaped, no line taken for a request.
fn roff_text(s: &str) -> String {
    s.replace('\\', "\\e")
        .lines()
        .map(|l| {
            // .nf/.fi: an example kept as written (no filling).
            if l.starts_with(['.', '\'']) && l != ".nf" && l != ".fi" {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const DOCS: &str = "The full documentation is in /usr/share/doc/settle (from the Debian \
    package) or docs/ of the source: spec.md (the contract), http-api.md (every route and \
    setting), operations.md (running it: systemd or not, TLS, reload, backup, restore, \
    migration), postgres.md, export-format.md, sdk.md.";

const EXIT_STATUS: &str = "0 success, 1 local failure, 2 usage error, 3 server unreachable, \
    4 invalid request (400/401/404/408/413/422), 5 protocol refusal (409), 6 try again later \
    (429 rate_limited/quota_exceeded, 5xx), 7 TLS handshake failed.";

fn root_sections(subs: &[String]) -> Vec<(&'static str, Vec<String>)> {
    let see_also = subs
        .iter()
        .map(|s| format!("{s}(1)"))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        ("EXIT STATUS", vec![EXIT_STATUS.to_string()]),
        (
            "FILES",
            vec![
                "/etc/settle/settle.toml: the configuration of the packaged service \
                 (settle-serve(1), CONFIGURATION FILE)."
                    .to_string(),
                "/var/lib/settle: its embedded store (the systemd unit's StateDirectory)."
                    .to_string(),
            ],
        ),
        ("SEE ALSO", vec![see_also, DOCS.to_string()]),
    ]
}

fn sub_sections(sub: &Command) -> Vec<(&'static str, Vec<String>)> {
    let mut s = Vec::new();
    if sub.get_name() == "serve" {
        s.push(("CONFIGURATION FILE", config_file(sub)));
        s.push((
            "ENVIRONMENT",
            vec![
                "Every option reads the variable shown with it (SETTLE_ and the option's name \
                 in upper case with _); an option given on the command line wins over its \
                 variable, and both over the configuration file."
                    .to_string(),
                "SETTLE_LOG (or RUST_LOG): the log filter, default info. Logs go to stderr; \
                 \"listening on ADDR\" goes to stdout once the server accepts connections."
                    .to_string(),
            ],
        ));
        s.push((
            "SIGNALS",
            vec![
                "SIGHUP reloads the configuration file (tenants, tokens, quotas, limits, the \
                 TLS certificate and key); a file that does not validate is refused whole and \
                 the running configuration stays. SIGTERM and SIGINT stop accepting, let \
                 requests in flight finish and close the store."
                    .to_string(),
            ],
        ));
    }
    if let Some(after) = sub.get_after_long_help().or(sub.get_after_help()) {
        s.push(("NOTES", vec![after.to_string()]));
    }
    s.push(("EXIT STATUS", vec![EXIT_STATUS.to_string()]));
    s.push(("SEE ALSO", vec!["settle(1)".to_string(), DOCS.to_string()]));
    s
}

/// Options of `settle serve` that are not keys of the configuration file:
/// the file itself, and what only makes sense per process.
const NOT_FILE_KEYS: [&str; 4] = ["config", "pid-file", "tenant", "admin-token-sha256"];

/// The configuration file's keys, from `serve`'s own options: every key is
/// an option's name with `_` for `-` (a test holds the file's parser to
/// this list).
pub fn config_file(serve: &Command) -> Vec<String> {
    vec![
        "--config FILE (SETTLE_CONFIG) is a TOML file; every key is optional and an unknown \
         key is refused. Precedence: option > variable > file > default. The store follows \
         the same order (--store or --data, else the file's store or data); a store setting \
         that loses, or an engine's tuning given to the other engine, is named in a warning \
         at start."
            .to_string(),
        format!(
            "Keys (each the option of the same name above, with its default): {}.",
            file_keys(serve).join(", ")
        ),
        "[[tenants]] tables (one per tenant; --tenant NAME=SHA256 adds to them): name; \
         token_sha256, the lowercase hex SHA-256 of the tenant's bearer token, or a list of \
         them during a rotation; optional quotas rate_per_s, burst, max_records."
            .to_string(),
        "[admin] table: token_sha256, a digest or a list of digests of the admin tokens \
         (settle backup, /v1/admin/...; --admin-token-sha256 adds to them)."
            .to_string(),
        "Example:\n.nf\nlisten = \"0.0.0.0:7411\"\ndata = \"/var/lib/settle\"\n\
         tls_cert = \"/etc/settle/tls/cert.pem\"\ntls_key = \"/etc/settle/tls/key.pem\"\n\n\
         [[tenants]]\nname = \"acme\"\ntoken_sha256 = \"<64 hex digits>\"\nrate_per_s = 500\n\n\
         [admin]\ntoken_sha256 = \"<64 hex digits>\"\n.fi"
            .to_string(),
    ]
}

/// The file keys named by `serve`'s visible options.
pub fn file_keys(serve: &Command) -> Vec<String> {
    serve
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| *l != "help" && !NOT_FILE_KEYS.contains(l))
        .map(|l| l.replace('-', "_"))
        .collect()
}

fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::local(format!("writing to stdout: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::CommandFactory;

    /// Every `settle-NAME(1)` any page names is a page that is written.
    #[test]
    fn every_page_named_is_a_page() {
        let pages = super::pages(crate::Cli::command()).unwrap();
        let names: BTreeSet<String> = pages.iter().map(|(n, _)| n.clone()).collect();
        assert!(
            names.contains("settle") && names.contains("settle-serve"),
            "{names:?}"
        );
        assert!(names.len() > 20, "{names:?}");
        let mut named = BTreeSet::new();
        for (_, page) in &pages {
            let text = String::from_utf8(page.clone()).unwrap().replace("\\-", "-");
            let mut rest = text.as_str();
            while let Some(i) = rest.find("settle-") {
                let tail = &rest[i..];
                let end = tail.find(['(', ' ', '\n', ',', '\\']).unwrap_or(tail.len());
                if tail[end..].starts_with("(1)") {
                    named.insert(tail[..end].to_string());
                }
                rest = &tail[end..];
            }
        }
        assert!(named.contains("settle-serve"), "{named:?}");
        let missing: Vec<_> = named.difference(&names).collect();
        assert!(missing.is_empty(), "named but not written: {missing:?}");
        let root = String::from_utf8(pages[0].1.clone()).unwrap();
        for name in names.iter().filter(|n| *n != "settle") {
            assert!(
                root.contains(&format!("{name}(1)")),
                "settle(1) does not name {name}"
            );
        }
    }

    /// settle-serve(1) names every key the configuration file's parser
    /// takes, and no other.
    #[test]
    fn the_serve_page_names_every_configuration_key() {
        let err = toml::from_str::<settle_server::config::FileConfig>("not_a_key = 1")
            .unwrap_err()
            .to_string();
        let listed = &err[err.find("expected one of").expect(&err)..];
        let parsed: BTreeSet<String> = listed
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        let cli = crate::Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        let mut documented: BTreeSet<String> = super::file_keys(serve).into_iter().collect();
        // The two tables, and the deprecated key the file still accepts
        // (hidden from --help and the page: it does nothing).
        documented.extend(["tenants", "admin", "thread_priorities"].map(String::from));
        assert_eq!(parsed, documented);
        let page = String::from_utf8(
            super::pages(crate::Cli::command())
                .unwrap()
                .into_iter()
                .find(|(n, _)| n == "settle-serve")
                .unwrap()
                .1,
        )
        .unwrap();
        assert!(page.contains(".SH \"CONFIGURATION FILE\""), "{page}");
        for key in super::file_keys(serve) {
            assert!(page.contains(&key), "settle-serve(1) does not name {key}");
        }
        assert!(page.contains("[[tenants]]") && page.contains("[admin]"));
    }
}

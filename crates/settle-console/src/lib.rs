//! # settle-console: the operator console of SPEC §9
//!
//! Plain HTML, CSS and one ES module, written by hand: no build step, no
//! framework, nothing fetched at run time. The files under `assets/` are
//! embedded in the binary with `include_bytes!`; `settle serve` answers
//! them at `/console/`. The page talks to the same `/v1` API as any
//! client, with a tenant token it keeps only in the tab's session storage.

/// One embedded file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asset {
    /// The file's bytes.
    pub bytes: &'static [u8],
    /// Its `Content-Type`.
    pub content_type: &'static str,
}

/// Every embedded file by its path below `/console/` (`""` is the page).
const ASSETS: &[(&str, Asset)] = &[
    (
        "",
        Asset {
            bytes: include_bytes!("../assets/index.html"),
            content_type: "text/html; charset=utf-8",
        },
    ),
    (
        "console.css",
        Asset {
            bytes: include_bytes!("../assets/console.css"),
            content_type: "text/css; charset=utf-8",
        },
    ),
    (
        "console.js",
        Asset {
            bytes: include_bytes!("../assets/console.js"),
            content_type: "text/javascript; charset=utf-8",
        },
    ),
    (
        "favicon.svg",
        Asset {
            bytes: include_bytes!("../assets/favicon.svg"),
            content_type: "image/svg+xml",
        },
    ),
];

/// The file at `path` below `/console/` (`""` or `index.html`: the page).
pub fn asset(path: &str) -> Option<Asset> {
    let path = if path == "index.html" { "" } else { path };
    ASSETS.iter().find(|(p, _)| *p == path).map(|(_, a)| *a)
}

/// The Content-Security-Policy the console is served with: only its own
/// files, no inline script, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'none'; \
     frame-ancestors 'none'; base-uri 'none'";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_referenced_file_is_embedded() {
        let page = std::str::from_utf8(asset("").unwrap().bytes).unwrap();
        for f in ["console.css", "console.js", "favicon.svg"] {
            assert!(page.contains(f), "the page references {f}");
            assert!(asset(f).is_some(), "{f} is embedded");
        }
        assert_eq!(asset("index.html"), asset(""));
        assert!(asset("../Cargo.toml").is_none());
        // No inline script: the CSP forbids it.
        assert!(!page.contains("<script>"));
        // Nothing from elsewhere.
        for a in ASSETS {
            // The SVG namespace is a name, not a fetch.
            let text = String::from_utf8_lossy(a.1.bytes).replace("http://www.w3.org/2000/svg", "");
            assert!(
                !text.contains("http://") && !text.contains("https://"),
                "{}",
                a.0
            );
        }
    }
}

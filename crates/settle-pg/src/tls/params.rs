//! Taking `sslmode` and `sslrootcert` out of a connection string, and
//! leaving the rest, byte for byte, to tokio-postgres.
//!
//! Both forms tokio-postgres accepts are read the way it reads them, so
//! that what is left parses exactly as it would have: a URL
//! (`postgres://` or `postgresql://`: everything before the first `@` is
//! credentials, the query starts at the first `?` after them, parameters
//! are `key=value` split on `&`, keys and values percent-decoded), or
//! `key=value` pairs separated by whitespace (values optionally in single
//! quotes, `\` escaping the next character). A later parameter overrides
//! an earlier one of the same name, as in libpq and tokio-postgres.
//!
//! Anything this reader cannot make sense of is left where it is, for
//! tokio-postgres to reject with its own message.

use super::TlsError;

/// What a connection string says about TLS, and the rest of it.
#[derive(Debug, PartialEq, Eq)]
pub struct Split {
    /// The connection string without `sslmode` and `sslrootcert`.
    pub rest: String,
    /// The value of the last `sslmode`, decoded.
    pub sslmode: Option<String>,
    /// The value of the last `sslrootcert`, decoded.
    pub sslrootcert: Option<String>,
}

impl Split {
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.sslmode = Some(value),
            "sslrootcert" => self.sslrootcert = Some(value),
            _ => return false,
        }
        true
    }
}

/// Splits `url` (a URL or key/value pairs) into its TLS parameters and the rest.
pub fn split(url: &str) -> Result<Split, TlsError> {
    for prefix in ["postgres://", "postgresql://"] {
        if url.starts_with(prefix) {
            return split_url(url, prefix.len());
        }
    }
    Ok(split_pairs(url))
}

fn split_url(url: &str, prefix: usize) -> Result<Split, TlsError> {
    let mut out = Split {
        rest: url.to_string(),
        sslmode: None,
        sslrootcert: None,
    };
    let body = &url[prefix..];
    // tokio-postgres takes everything up to the first '@' as the
    // credentials (a password may hold an unencoded '?').
    let after_credentials = body.find('@').map_or(0, |i| i + 1);
    let Some(q) = body[after_credentials..].find('?') else {
        return Ok(out);
    };
    let query_at = prefix + after_credentials + q;
    let mut kept: Vec<&str> = Vec::new();
    let mut rest = &url[query_at + 1..];
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else {
            // "unterminated parameter": tokio-postgres says so.
            kept.push(rest);
            break;
        };
        let (value, next) = match rest[eq + 1..].find('&') {
            Some(amp) => (&rest[eq + 1..eq + 1 + amp], &rest[eq + 2 + amp..]),
            None => (&rest[eq + 1..], ""),
        };
        let param = &rest[..eq + 1 + value.len()];
        // A key that does not decode is not one of ours (tokio-postgres
        // rejects it).
        let key = decode(&rest[..eq]);
        match key.as_deref() {
            Some(name @ ("sslmode" | "sslrootcert")) => {
                let v = decode(value).ok_or(TlsError::Encoding(name.to_string()))?;
                out.take(name, v);
            }
            _ => kept.push(param),
        }
        rest = next;
    }
    let mut s = url[..query_at].to_string();
    if !kept.is_empty() {
        s.push('?');
        s.push_str(&kept.join("&"));
    }
    out.rest = s;
    Ok(out)
}

/// Percent-decoding as tokio-postgres does it: `%` and two hex digits is a
/// byte, any other `%` stays; the result must be UTF-8. `+` stays `+`.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The key/value form, read as tokio-postgres's parser reads it.
fn split_pairs(s: &str) -> Split {
    let mut out = Split {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let mut p = Pairs {
        s,
        it: s.char_indices().peekable(),
    };
    let mut last = 0;
    while let Some((start, key, value, end)) = p.pair() {
        if out.take(key, value) {
            out.rest.push_str(&s[last..start]);
            out.rest.push(' ');
            last = end;
        }
    }
    out.rest.push_str(&s[last..]);
    out
}

struct Pairs<'a> {
    s: &'a str,
    it: std::iter::Peekable<std::str::CharIndices<'a>>,
}

impl<'a> Pairs<'a> {
    fn at(&mut self) -> usize {
        self.it.peek().map_or(self.s.len(), |&(i, _)| i)
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.at();
        while self.it.peek().is_some_and(|&(_, c)| f(c)) {
            self.it.next();
        }
        &self.s[start..self.at()]
    }

    fn eat(&mut self, c: char) -> bool {
        self.it.next_if(|&(_, x)| x == c).is_some()
    }

    /// The next `key = value`: where it starts, the key, the unescaped
    /// value, and where it ends. None at the end or where the text does
    /// not parse (tokio-postgres then reports it).
    fn pair(&mut self) -> Option<(usize, &'a str, String, usize)> {
        self.take_while(char::is_whitespace);
        let start = self.at();
        let key = self.take_while(|c| !c.is_whitespace() && c != '=');
        if key.is_empty() {
            return None;
        }
        self.take_while(char::is_whitespace);
        if !self.eat('=') {
            return None;
        }
        self.take_while(char::is_whitespace);
        let quoted = self.eat('\'');
        let mut value = String::new();
        loop {
            match self.it.peek() {
                Some(&(_, '\'')) if quoted => {
                    self.it.next();
                    break;
                }
                Some(&(_, c)) if !quoted && c.is_whitespace() => break,
                Some(&(_, c)) => {
                    self.it.next();
                    if c == '\\' {
                        if let Some((_, escaped)) = self.it.next() {
                            value.push(escaped);
                        }
                    } else {
                        value.push(c);
                    }
                }
                // An unterminated quote: tokio-postgres reports it.
                None if quoted => return None,
                None => break,
            }
        }
        if !quoted && value.is_empty() {
            return None;
        }
        Some((start, key, value, self.at()))
    }
}

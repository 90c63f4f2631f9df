//! tokio-postgres's TLS hooks over tokio-rustls: a connector per host, the
//! TLS stream, and the `tls-server-end-point` channel binding that
//! SCRAM-SHA-256-PLUS authentication sends.
//!
//! Not tokio-postgres-rustls (0.14), although it fits the same rustls,
//! tokio-rustls and tokio-postgres: its channel binding knows no
//! ecdsa-with-SHA512, ecdsa-with-SHA1 or md5WithRSAEncryption, and binds
//! nothing for them where PostgreSQL hashes the certificate (SHA-512,
//! SHA-256, SHA-256), so `channel_binding=require` would fail against such
//! a server certificate; and its stream type cannot be given another
//! channel binding. The certificate's header bytes are read by the `der`
//! crate and the signature algorithms named by `const-oid`'s database.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use const_oid::ObjectIdentifier;
use const_oid::db::rfc5912::{
    ECDSA_WITH_SHA_256, ECDSA_WITH_SHA_384, ECDSA_WITH_SHA_512, MD_5_WITH_RSA_ENCRYPTION,
    SHA_1_WITH_RSA_ENCRYPTION, SHA_256_WITH_RSA_ENCRYPTION, SHA_384_WITH_RSA_ENCRYPTION,
    SHA_512_WITH_RSA_ENCRYPTION,
};
use der::{Decode, Header, Reader, SliceReader};
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

/// Makes a TLS connector for each host tokio-postgres connects to; the
/// settings (and their verifier) are shared by every connection of a store.
#[derive(Clone)]
pub struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl MakeRustls {
    pub fn new(config: Arc<ClientConfig>) -> MakeRustls {
        MakeRustls { config }
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Rustls<S>;
    type TlsConnect = Handshake;
    type Error = io::Error;

    /// `domain` is the `host` being connected to (`""` for a Unix socket,
    /// where PostgreSQL never speaks TLS): its validity is checked at the
    /// handshake, so that `sslmode=prefer` over a socket stays possible.
    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Handshake> {
        Ok(Handshake {
            config: self.config.clone(),
            domain: domain.to_string(),
        })
    }
}

/// One TLS handshake with one host.
pub struct Handshake {
    config: Arc<ClientConfig>,
    domain: String,
}

impl<S> TlsConnect<S> for Handshake
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Rustls<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Rustls<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            // A DNS name (also sent as SNI) or an IP address.
            let name = ServerName::try_from(self.domain).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not a host name for TLS: {e}"),
                )
            })?;
            let tls = TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(Rustls(tls))
        })
    }
}

/// A TLS connection to the server.
pub struct Rustls<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Rustls<S> {
    /// RFC 5929 `tls-server-end-point`: the hash of the server's
    /// certificate, by the hash of its signature algorithm (SHA-256 for
    /// MD5 and SHA-1). None when that algorithm has no such hash (Ed25519,
    /// RSA-PSS): SCRAM then runs without channel binding, unless
    /// `channel_binding=require` refuses to.
    fn channel_binding(&self) -> ChannelBinding {
        let cert = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first());
        match cert.and_then(|c| end_point_hash(c.as_ref())) {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Rustls<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Rustls<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// ecdsa-with-SHA1 (ANSI X9.62), which const-oid's database does not name.
const ECDSA_WITH_SHA_1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.1");

/// The `tls-server-end-point` hash of a DER certificate, if its signature
/// algorithm names one: the table PostgreSQL's server uses (RFC 5929 §4.1:
/// MD5 and SHA-1 become SHA-256).
pub(super) fn end_point_hash(cert: &[u8]) -> Option<Vec<u8>> {
    let oid = ObjectIdentifier::from_bytes(signature_oid(cert)?).ok()?;
    match oid {
        MD_5_WITH_RSA_ENCRYPTION
        | SHA_1_WITH_RSA_ENCRYPTION
        | SHA_256_WITH_RSA_ENCRYPTION
        | ECDSA_WITH_SHA_1
        | ECDSA_WITH_SHA_256 => Some(Sha256::digest(cert).to_vec()),
        SHA_384_WITH_RSA_ENCRYPTION | ECDSA_WITH_SHA_384 => Some(Sha384::digest(cert).to_vec()),
        SHA_512_WITH_RSA_ENCRYPTION | ECDSA_WITH_SHA_512 => Some(Sha512::digest(cert).to_vec()),
        _ => None,
    }
}

/// The OID of `Certificate.signatureAlgorithm` (RFC 5280: SEQUENCE {
/// tbsCertificate SEQUENCE, signatureAlgorithm SEQUENCE { OID, … }, … }).
/// The certificate was parsed and verified (or accepted) by rustls already;
/// anything unexpected here is None, never a panic.
fn signature_oid(cert: &[u8]) -> Option<&[u8]> {
    let (certificate, _) = der(cert, 0x30)?;
    let (_tbs, after_tbs) = der(certificate, 0x30)?;
    let (algorithm, _) = der(after_tbs, 0x30)?;
    let (oid, _) = der(algorithm, 0x06)?;
    Some(oid)
}

/// One DER element with the given tag at the start of `b`: its contents
/// and what follows it. The header (tag and length) is read by the `der`
/// crate, which refuses what is not DER (indefinite or overlong lengths),
/// as webpki did before the handshake could complete.
fn der(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if b.first() != Some(&tag) {
        return None;
    }
    let mut reader = SliceReader::new(b).ok()?;
    let header = Header::decode(&mut reader).ok()?;
    let contents = reader.read_slice(header.length()).ok()?;
    let rest = b.get(usize::try_from(reader.position()).ok()?..)?;
    Some((contents, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_elements_are_read_with_short_and_long_lengths() {
        assert_eq!(
            der(&[0x06, 0x01, 0x2a, 0xff], 0x06),
            Some((&[0x2a][..], &[0xff][..]))
        );
        let mut long = vec![0x04, 0x82, 0x01, 0x00];
        long.extend(std::iter::repeat_n(7u8, 256));
        let (contents, rest) = der(&long, 0x04).unwrap();
        assert_eq!((contents.len(), rest.len()), (256, 0));
        // wrong tag, truncated, indefinite length
        assert_eq!(der(&[0x30, 0x01, 0x00], 0x06), None);
        assert_eq!(der(&[0x30, 0x05, 0x00], 0x30), None);
        assert_eq!(der(&[0x30, 0x80, 0x00], 0x30), None);
        assert_eq!(der(&[], 0x30), None);
    }

    #[test]
    fn garbage_has_no_end_point_hash() {
        assert_eq!(end_point_hash(b""), None);
        assert_eq!(end_point_hash(b"\x30\x03\x02\x01\x00"), None);
    }
}

//! `settle_local._native`: the PyO3 face of [`settle_local::LocalLedger`].
//!
//! One class, `Ledger`: `exchange(method, target, headers, body)` answers
//! `(status, body, retry_after)`, what `settle_client`'s `Client` reads of
//! an answer, and `LocalLedger` calls it directly (no HTTP objects);
//! `request(...)` answers `(status, headers, body)` for the httpx
//! transports that serve any route. Every call that may wait on the store
//! (open, exchange, request, close) releases the GIL.

use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use settle_local::{LocalError, LocalLedger, LocalOptions};

create_exception!(
    _native,
    Closed,
    PyRuntimeError,
    "The ledger was closed (settle_local raises settle_client.LedgerClosed)."
);

fn to_py(e: LocalError) -> PyErr {
    match e {
        LocalError::Open { .. } => PyOSError::new_err(e.to_string()),
        LocalError::Invalid(_) => PyValueError::new_err(e.to_string()),
        LocalError::Closed => Closed::new_err(e.to_string()),
        LocalError::Body(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// `(status, headers, body)`.
type Reply<'py> = (u16, Vec<(String, String)>, Bound<'py, PyBytes>);

/// `(status, body, retry_after)`.
type Answer<'py> = (u16, Bound<'py, PyBytes>, Option<String>);

/// A settle server in this process (the in-memory store, or the embedded
/// engine when `data` names a directory).
#[pyclass(frozen, module = "settle_local._native")]
struct Ledger {
    inner: LocalLedger,
}

#[pymethods]
impl Ledger {
    #[new]
    #[pyo3(signature = (data=None, segment_bytes=None))]
    fn new(py: Python<'_>, data: Option<PathBuf>, segment_bytes: Option<u64>) -> PyResult<Ledger> {
        let mut options = LocalOptions::default();
        if let Some(n) = segment_bytes {
            options.segment_bytes = n;
        }
        let inner = py
            .detach(|| LocalLedger::open_with(data.as_deref(), &options))
            .map_err(to_py)?;
        Ok(Ledger { inner })
    }

    /// Whether receipts survive the process.
    #[getter]
    fn durable(&self) -> bool {
        self.inner.durable()
    }

    /// One call of the API, as the SDK's client makes it: `target` is the
    /// path with its query.
    fn exchange<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        target: &str,
        headers: Vec<(String, String)>,
        body: &[u8],
    ) -> PyResult<Answer<'py>> {
        let body = body.to_vec();
        let answer = py
            .detach(|| self.inner.exchange(method, target, &headers, body))
            .map_err(to_py)?;
        Ok((
            answer.status,
            PyBytes::new(py, &answer.body),
            answer.retry_after,
        ))
    }

    /// One HTTP exchange with every header of the answer.
    fn request<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        target: &str,
        headers: Vec<(String, String)>,
        body: &[u8],
    ) -> PyResult<Reply<'py>> {
        let body = body.to_vec();
        let reply = py
            .detach(|| self.inner.call(method, target, &headers, body))
            .map_err(to_py)?;
        Ok((reply.status, reply.headers, PyBytes::new(py, &reply.body)))
    }

    /// Closes the store; later calls raise `Closed`.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Ledger>()?;
    m.add("Closed", m.py().get_type::<Closed>())
}

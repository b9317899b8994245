//! What a rule writes to stdout and stderr: kept up to a cap per evaluation
//! and re-emitted as tracing events, the rest dropped and counted. Never a
//! trap: a chatty rule is not a broken one. Drained after every call, so an
//! instance kept for reuse starts each evaluation empty.

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// A capped, drainable output stream, shared by the sandbox and the guest.
#[derive(Clone)]
pub(crate) struct Capture {
    inner: Arc<Mutex<Captured>>,
    capacity: usize,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

impl Capture {
    pub(crate) fn new(capacity: usize) -> Self {
        Capture {
            inner: Arc::default(),
            capacity,
        }
    }

    /// What was written since the last drain, and how many bytes past the cap were dropped.
    pub(crate) fn drain(&self) -> (Vec<u8>, usize) {
        let mut c = self.inner.lock().expect("capture lock");
        (std::mem::take(&mut c.bytes), std::mem::take(&mut c.dropped))
    }

    fn append(&self, data: &[u8]) {
        let mut c = self.inner.lock().expect("capture lock");
        let room = self.capacity.saturating_sub(c.bytes.len());
        let kept = data.len().min(room);
        c.bytes.extend_from_slice(&data[..kept]);
        c.dropped += data.len() - kept;
    }
}

impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        // Always accepts: what passes the cap is dropped, never refused.
        Ok(64 << 10)
    }
}

#[async_trait::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_dropped_and_counted_then_drained() {
        let mut c = Capture::new(8);
        c.write(Bytes::from_static(b"hello ")).unwrap();
        c.write(Bytes::from_static(b"world!")).unwrap();
        assert_eq!(c.drain(), (b"hello wo".to_vec(), 4));
        assert_eq!(c.drain(), (Vec::new(), 0));
        c.write(Bytes::from_static(b"again")).unwrap();
        assert_eq!(c.drain().0, b"again");
    }
}

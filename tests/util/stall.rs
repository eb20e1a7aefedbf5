//! A TCP proxy in front of any server (S3, BigQuery's REST and gRPC, Pub/Sub) that passes bytes
//! both ways until told to stall, and from then on forwards nothing, in either direction, on any
//! connection, old or new, while keeping every connection open: a destination that stops
//! answering mid-run, whatever its protocol. Unlike [`super::hold::HoldProxy`] it does not read
//! the protocol: a stall is for good (what was held never reaches the server).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The proxy: its port, and the flags its threads read. Dropping it closes every connection.
pub struct StallProxy {
    pub port: u16,
    stalled: Arc<AtomicBool>,
    gone: Arc<AtomicBool>,
}

impl StallProxy {
    /// A proxy to `127.0.0.1:upstream`, passing everything.
    pub fn start(upstream: u16) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stalled = Arc::new(AtomicBool::new(false));
        let gone = Arc::new(AtomicBool::new(false));
        let (st, g) = (stalled.clone(), gone.clone());
        std::thread::spawn(move || {
            // Connections taken while stalled: kept open, never answered.
            let mut parked = Vec::new();
            while !g.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                let _ = client.set_nonblocking(false);
                if st.load(Ordering::SeqCst) {
                    parked.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let (st, g) = (st.clone(), g.clone());
                    std::thread::spawn(move || pipe(from, to, &st, &g));
                }
            }
        });
        StallProxy {
            port,
            stalled,
            gone,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Forward nothing from now on (for good).
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.gone.store(true, Ordering::SeqCst);
    }
}

/// Copy `from` into `to` until either closes; once `stalled`, what is read is dropped (the
/// connection stays open, silent) until the proxy is `gone`.
fn pipe(mut from: TcpStream, mut to: TcpStream, stalled: &AtomicBool, gone: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 16 * 1024];
    while !gone.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !stalled.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    if !stalled.load(Ordering::SeqCst) || gone.load(Ordering::SeqCst) {
        let _ = to.shutdown(std::net::Shutdown::Both);
    }
}

//! A TCP proxy in front of a gRPC (HTTP/2, plaintext) server that holds back the server's answer
//! to a large request, breaks connections or refuses them on demand: the moment "the server has
//! done it, the client does not know yet", made on purpose.
//!
//! Bytes pass unchanged in both directions. The server's side is split into HTTP/2 frames (9-byte
//! header, then the payload), so that "the server's next message" can be told: once armed with
//! [`HoldProxy::hold_answer_after`] and once the client has sent that many bytes since, the
//! server's first DATA frame with a payload (a response message) and everything after it are held
//! — never passed on. [`HoldProxy::held`] says when that happened.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct State {
    /// New connections are closed at once.
    refuse: AtomicBool,
    /// Connections closed so.
    refused: AtomicU64,
    /// Hold the answer once the client has sent this many bytes (0: not armed).
    hold_after: AtomicU64,
    /// Client bytes since arming.
    sent: AtomicU64,
    /// An answer is held.
    held: AtomicBool,
    /// Live connections (both halves), to break on demand.
    conns: Mutex<Vec<(TcpStream, TcpStream)>>,
}

/// The proxy; it stops serving when dropped (its threads end with their connections).
pub struct HoldProxy {
    pub port: u16,
    state: Arc<State>,
}

impl HoldProxy {
    /// A proxy to `127.0.0.1:upstream`, passing everything.
    pub fn start(upstream: u16) -> HoldProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let st = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if st.refuse.load(Ordering::SeqCst) {
                    st.refused.fetch_add(1, Ordering::SeqCst);
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                st.conns
                    .lock()
                    .unwrap()
                    .push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let up = st.clone();
                std::thread::spawn(move || client_to_server(client, server, &up));
                let down = st.clone();
                std::thread::spawn(move || server_to_client(s2, c2, &down));
            }
        });
        HoldProxy { port, state }
    }

    /// `http://127.0.0.1:PORT`, for `--bigquery-storage-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Hold the server's next answer once the client has sent `bytes` more bytes (a request that
    /// large: the requests before it are smaller).
    pub fn hold_answer_after(&self, bytes: u64) {
        self.state.sent.store(0, Ordering::SeqCst);
        self.state.held.store(false, Ordering::SeqCst);
        self.state.hold_after.store(bytes, Ordering::SeqCst);
    }

    /// Has an answer been held?
    pub fn held(&self) -> bool {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Wait up to `limit` until an answer is held.
    pub fn wait_held(&self, limit: Duration) {
        super::poll(limit, Duration::from_millis(20), || {
            if self.held() {
                Ok(())
            } else {
                Err(format!("no answer held within {limit:?}"))
            }
        })
    }

    /// Close new connections at once (`true`), or serve them again.
    pub fn refuse(&self, on: bool) {
        self.state.refuse.store(on, Ordering::SeqCst);
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// Break every live connection (both sides) and stop holding: the client sees its calls on
    /// them fail, and new connections pass.
    pub fn break_all(&self) {
        self.state.hold_after.store(0, Ordering::SeqCst);
        for (c, s) in self.state.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.refuse(true);
        self.break_all();
    }
}

fn client_to_server(mut client: TcpStream, mut server: TcpStream, st: &State) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        st.sent.fetch_add(n as u64, Ordering::SeqCst);
        if server.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
    let _ = client.shutdown(Shutdown::Both);
}

fn server_to_client(mut server: TcpStream, mut client: TcpStream, st: &State) {
    // Frames of the server: what is left of the current frame's payload, and its header so far.
    let mut header: Vec<u8> = Vec::with_capacity(9);
    let mut left = 0usize;
    let mut holding = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if holding {
            continue;
        }
        // Pass on bytes up to the start of the frame to hold (a header begun in an earlier
        // read was passed on in part: the client waits for the rest, which never comes).
        let mut i = 0;
        let mut pass_until = n;
        while i < n {
            if left > 0 {
                let k = left.min(n - i);
                left -= k;
                i += k;
                continue;
            }
            let here = i;
            let k = (9 - header.len()).min(n - i);
            header.extend_from_slice(&buf[i..i + k]);
            i += k;
            if header.len() < 9 {
                break;
            }
            let len = (header[0] as usize) << 16 | (header[1] as usize) << 8 | header[2] as usize;
            let kind = header[3];
            header.clear();
            left = len;
            let after = st.hold_after.load(Ordering::SeqCst);
            if kind == 0 && len > 0 && after > 0 && st.sent.load(Ordering::SeqCst) >= after {
                pass_until = here;
                holding = true;
                st.held.store(true, Ordering::SeqCst);
                break;
            }
        }
        if client.write_all(&buf[..pass_until]).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}

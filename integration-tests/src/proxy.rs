//! A TCP proxy in front of a real server that can be switched to failing:
//! while it is down it cuts the open connections and answers every new one
//! with `503 Service Unavailable`, as an overloaded or restarting S3 endpoint
//! does.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The proxy; it stops serving when dropped.
pub struct FaultProxy {
    port: u16,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Proxies a loopback port of `127.0.0.1:<upstream>`.
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
        let port = listener.local_addr().unwrap().port();
        let p = FaultProxy {
            port,
            up: Arc::new(AtomicBool::new(true)),
            open: Arc::default(),
            refused: Arc::default(),
            stop: Arc::default(),
        };
        let (up, open, refused, stop) = (
            p.up.clone(),
            p.open.clone(),
            p.refused.clone(),
            p.stop.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = conn else { continue };
                if !up.load(Ordering::Relaxed) {
                    refused.fetch_add(1, Ordering::Relaxed);
                    std::thread::spawn(move || refuse(client));
                    continue;
                }
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream)) else {
                    continue;
                };
                {
                    let mut o = open.lock().unwrap();
                    o.retain(|s| s.peer_addr().is_ok());
                    o.push(client.try_clone().unwrap());
                    o.push(server.try_clone().unwrap());
                }
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        p
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Switches to failing (cutting what is open) or back to proxying.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        if !up {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Connections answered with 503 so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.set_up(false);
        // Wake the accept loop so it sees the stop flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

fn refuse(mut c: TcpStream) {
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    // Read the request head, so the client is not cut off mid-write before
    // it can see the answer.
    let mut buf = [0u8; 8192];
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if seen.len() > 64 * 1024 {
            break;
        }
    }
    let _ = c.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let _ = c.shutdown(Shutdown::Both);
}

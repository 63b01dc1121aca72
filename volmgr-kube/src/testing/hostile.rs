//! Hostile "API servers" on 127.0.0.1, for the bounds of the agent's API
//! client: one answering invalid JSON, one that never answers, one that
//! drips a byte every 2 s, one whose pods list never ends, one whose watch
//! event line never ends, one with a certificate the kubeconfig's CA did
//! not sign, and a port that refuses connections. HTTPS (HTTP/1.1, no
//! ALPN), self-signed with rcgen; every connection ends with the server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::self_signed;

/// What the server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every answer is `200` with a body that is not JSON.
    Garbage,
    /// Accepts and completes TLS, then never answers.
    Silent,
    /// Sends the headers of a list, then its body a byte every 2 s.
    Drip,
    /// A pods list whose body never ends.
    EndlessList,
    /// An empty pods list, then a watch whose first line never ends.
    EndlessWatchLine,
    /// A certificate signed by another CA than the kubeconfig's.
    WrongCa,
    /// Nothing listens on the port.
    Refused,
}

/// The server (stops with its runtime when dropped).
pub struct HostileServer {
    /// Where it listens.
    pub addr: SocketAddr,
    ca_pem: String,
    requests: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl HostileServer {
    /// Starts a server in `mode` on a free port of 127.0.0.1.
    pub fn start(mode: Mode) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (mut ca_pem, tls) = self_signed();
        if mode == Mode::WrongCa {
            ca_pem = self_signed().0;
        }
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        if mode == Mode::Refused {
            drop(listener);
        } else {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            let counter = Arc::clone(&requests);
            runtime.spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let (acceptor, counter) = (acceptor.clone(), Arc::clone(&counter));
                    tokio::spawn(async move {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            let _ = serve(mode, tls, &counter).await;
                        }
                    });
                }
            });
        }
        Self {
            addr,
            ca_pem,
            requests,
            _runtime: runtime,
        }
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Writes a kubeconfig for this server into `dir`; returns its path.
    pub fn write_kubeconfig(&self, dir: &Path) -> PathBuf {
        super::write_kubeconfig(dir, "hostile", self.addr, &self.ca_pem)
    }
}

type Tls = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Reads one request head; `None` at the end of the connection.
async fn read_head(tls: &mut Tls) -> std::io::Result<Option<String>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte).await? == 0 || head.len() > 65536 {
            return Ok(None);
        }
        head.push(byte[0]);
    }
    Ok(Some(String::from_utf8_lossy(&head).into_owned()))
}

const LIST_HEAD: &str = "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{\"metadata\":{\"name\":\"";

async fn serve(mode: Mode, mut tls: Tls, counter: &AtomicU64) -> std::io::Result<()> {
    while let Some(head) = read_head(&mut tls).await? {
        counter.fetch_add(1, Ordering::Relaxed);
        let watch = head.contains("watch=true") || head.contains("watch=1");
        match (mode, watch) {
            (Mode::Garbage, _) => {
                let body = "{\"kind\":\"PodList\",\"items\":[} this is not JSON";
                ok(&mut tls, Some(body.len())).await?;
                tls.write_all(body.as_bytes()).await?;
            }
            (Mode::Drip, _) => {
                let body = "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[]}";
                ok(&mut tls, Some(body.len())).await?;
                for b in body.bytes() {
                    tls.write_all(&[b]).await?;
                    tls.flush().await?;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            (Mode::EndlessList, false) => {
                ok(&mut tls, None).await?;
                tls.write_all(LIST_HEAD.as_bytes()).await?;
                endless(&mut tls).await?;
            }
            (Mode::EndlessWatchLine, false) => {
                let body = "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[]}";
                ok(&mut tls, Some(body.len())).await?;
                tls.write_all(body.as_bytes()).await?;
            }
            (Mode::EndlessWatchLine, true) => {
                ok(&mut tls, None).await?;
                tls.write_all(b"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"")
                    .await?;
                endless(&mut tls).await?;
            }
            _ => std::future::pending::<()>().await,
        }
        tls.flush().await?;
    }
    Ok(())
}

/// `200 OK` headers: with a length, or a body until the connection ends.
async fn ok(tls: &mut Tls, len: Option<usize>) -> std::io::Result<()> {
    let length = match len {
        Some(n) => format!("Content-Length: {n}\r\n"),
        None => "Connection: close\r\n".to_string(),
    };
    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n");
    tls.write_all(head.as_bytes()).await?;
    tls.flush().await
}

/// Writes `a` for ever (until the client goes).
async fn endless(tls: &mut Tls) -> std::io::Result<()> {
    let chunk = vec![b'a'; 64 << 10];
    loop {
        tls.write_all(&chunk).await?;
    }
}

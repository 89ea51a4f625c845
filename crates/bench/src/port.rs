//! Free port: asks the kernel for an unused TCP port on 127.0.0.1 and prints it, for servers
//! that cannot listen on port 0 and report the port they got (and for restarts, which must
//! come back on the same port).

use std::net::TcpListener;

pub fn run() -> Result<(), String> {
    println!("{}", free_port().map_err(|e| format!("cannot pick a free port: {e}"))?);
    Ok(())
}

/// An unused TCP port on 127.0.0.1 (free again once this returns; the caller binds it right
/// away).
pub fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    drop(listener);
    Ok(port)
}

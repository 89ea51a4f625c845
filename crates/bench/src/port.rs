//! Free port: asks the kernel for an unused TCP port on 127.0.0.1 and prints it, for servers
//! that cannot listen on port 0 and report the port they got (and for restarts, which must
//! come back on the same port).

use std::net::TcpListener;

pub fn run() -> Result<(), String> {
    println!("{}", free_port()?);
    Ok(())
}

/// An unused TCP port on 127.0.0.1 (free again once this returns; the caller binds it right
/// away).
pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot bind 127.0.0.1:0: {e}"))?;
    let port = listener.local_addr().map_err(|e| format!("cannot read the bound address: {e}"))?.port();
    drop(listener);
    Ok(port)
}

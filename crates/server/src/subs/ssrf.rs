//! Which webhook URLs the server will call (protocol section 12.8): a subscriber must not turn
//! the server into a client of the networks behind it.
//!
//! - `https` only. In development mode (`--dev-webhooks`) also `http`, and only to `localhost`
//!   or a `127.0.0.0/8` address, so tests can run a receiver on the loopback.
//! - Addresses in private, loopback, link-local (cloud metadata), shared, multicast and reserved
//!   ranges are refused, as literals in the URL and as what a name resolves to (checked at
//!   every connection by [`Resolver`], so a name cannot be re-pointed after the check). IPv6
//!   literals are refused.
//! - Redirects and proxies are off in the client that sends webhooks ([`super::dispatch`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use reqwest::Url;

/// Why a webhook URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("not a valid absolute URL")]
    Unparseable,
    #[error("webhooks need https (http only to the loopback in development mode)")]
    Scheme,
    #[error("the host is a private, loopback, link-local or reserved address")]
    BlockedAddress,
    #[error("IPv6 address literals are not accepted")]
    Ipv6Literal,
    #[error("URLs with credentials are not accepted")]
    Credentials,
}

fn loopback_v4(ip: Ipv4Addr) -> bool {
    ip.octets()[0] == 127
}

/// Whether a host name can only ever mean this machine: `localhost` and every name under it
/// (RFC 6761 section 6.3), with or without the root's trailing dot. Refused when the URL is
/// given, not only when a delivery resolves it.
fn loopback_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// Whether an IPv4 address may not be called (in any mode, but see [`allowed`]).
fn blocked_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0
        || a == 10
        || (a == 100 && (64..128).contains(&b))
        || a == 127
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 192 && b == 168)
        || (a == 198 && (18..20).contains(&b))
        || a >= 224
}

/// Whether the server may connect to `ip`; `dev`: development mode, where loopback is allowed.
pub fn allowed(ip: IpAddr, dev: bool) -> bool {
    match ip {
        IpAddr::V4(v4) => !blocked_v4(v4) || (dev && loopback_v4(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => !blocked_v4(v4) || (dev && loopback_v4(v4)),
            // Global unicast only (2000::/3); loopback only in development mode.
            None => (v6.segments()[0] & 0xe000) == 0x2000 || (dev && v6.is_loopback()),
        },
    }
}

/// Checks a webhook URL as given at subscription time (and again before every delivery).
pub fn check(url: &str, dev: bool) -> Result<Url, Rejected> {
    let u = Url::parse(url).map_err(|_| Rejected::Unparseable)?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(Rejected::Credentials);
    }
    let host = u.host().ok_or(Rejected::Unparseable)?;
    let loopback = match host {
        url::Host::Domain(d) => loopback_name(d),
        url::Host::Ipv4(ip) => loopback_v4(ip),
        url::Host::Ipv6(_) => return Err(Rejected::Ipv6Literal),
    };
    match u.scheme() {
        "https" => {}
        "http" if dev && loopback => {}
        _ => return Err(Rejected::Scheme),
    }
    if loopback && !dev {
        return Err(Rejected::BlockedAddress);
    }
    if let url::Host::Ipv4(ip) = host {
        if !allowed(IpAddr::V4(ip), dev) {
            return Err(Rejected::BlockedAddress);
        }
    }
    Ok(u)
}

/// Name resolution for webhook deliveries that drops addresses the server may not call.
pub struct Resolver {
    pub dev: bool,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let dev = self.dev;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.filter(|a| allowed(a.ip(), dev)).collect();
            if addrs.is_empty() {
                return Err(
                    Box::new(std::io::Error::other(format!("{host} resolves to no address webhooks may call")))
                        as Box<dyn std::error::Error + Send + Sync>,
                );
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_table() {
        let cases: &[(&str, bool, Result<(), Rejected>)] = &[
            ("https://hooks.example.com/x", false, Ok(())),
            ("https://93.184.216.34/x", false, Ok(())),
            ("http://hooks.example.com/x", false, Err(Rejected::Scheme)),
            ("http://hooks.example.com/x", true, Err(Rejected::Scheme)),
            ("http://10.0.0.1/hook", false, Err(Rejected::Scheme)),
            ("http://10.0.0.1/hook", true, Err(Rejected::Scheme)),
            ("https://10.0.0.1/hook", true, Err(Rejected::BlockedAddress)),
            ("https://169.254.169.254/latest/meta-data", false, Err(Rejected::BlockedAddress)),
            ("https://172.20.1.1/", false, Err(Rejected::BlockedAddress)),
            ("https://192.168.1.1/", false, Err(Rejected::BlockedAddress)),
            ("https://100.100.1.1/", false, Err(Rejected::BlockedAddress)),
            ("https://0.0.0.0/", false, Err(Rejected::BlockedAddress)),
            ("https://224.0.0.1/", false, Err(Rejected::BlockedAddress)),
            ("https://127.0.0.1/", false, Err(Rejected::BlockedAddress)),
            ("https://localhost/", false, Err(Rejected::BlockedAddress)),
            ("https://localhost./", false, Err(Rejected::BlockedAddress)),
            ("https://LocalHost./x", false, Err(Rejected::BlockedAddress)),
            ("https://a.localhost/", false, Err(Rejected::BlockedAddress)),
            ("https://a.b.localhost./", false, Err(Rejected::BlockedAddress)),
            ("https://localhost.example.com/", false, Ok(())),
            ("https://notlocalhost/", false, Ok(())),
            ("http://a.localhost:9/webhook", true, Ok(())),
            ("http://127.0.0.1:9/webhook", false, Err(Rejected::Scheme)),
            ("http://127.0.0.1:9/webhook", true, Ok(())),
            ("http://localhost:9/webhook", true, Ok(())),
            ("https://[::1]/", true, Err(Rejected::Ipv6Literal)),
            ("https://user:pw@hooks.example.com/", false, Err(Rejected::Credentials)),
            ("not a url", false, Err(Rejected::Unparseable)),
            ("ftp://hooks.example.com/", false, Err(Rejected::Scheme)),
        ];
        for (url, dev, want) in cases {
            assert_eq!(check(url, *dev).map(|_| ()), *want, "{url} (dev {dev})");
        }
    }

    #[test]
    fn resolved_addresses_are_filtered() {
        for (ip, dev, want) in [
            ("93.184.216.34", false, true),
            ("10.1.2.3", false, false),
            ("127.0.0.1", false, false),
            ("127.0.0.1", true, true),
            ("10.1.2.3", true, false),
            ("2606:4700::1", false, true),
            ("fd00::1", false, false),
            ("fe80::1", false, false),
            ("::1", false, false),
            ("::1", true, true),
            ("::ffff:10.0.0.1", false, false),
        ] {
            assert_eq!(allowed(ip.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), dev), want, "{ip} (dev {dev})");
        }
    }
}

"""Where webhooks may go (issue 27, finding 2): a receiver is somewhere on the public internet, never
this machine, its private network, a link-local metadata service or a multicast group — unless
WARDEN_WEBHOOK_ALLOWED_HOSTS names it (a hostname, an address or a network: "hooks.internal",
"10.1.2.3", "10.0.0.0/8"). Checked when an endpoint is saved and again at every delivery, on the
addresses the name resolves to then, and the delivery connects to the address it checked (a name
that resolves elsewhere a moment later — DNS rebinding — changes nothing)."""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings


@dataclass(frozen=True)
class Target:
    """A checked receiver: its host as written, and the address to connect to."""

    host: str
    address: str


class TargetRefused(Exception):
    pass


def _allowed(host: str, address: ipaddress._BaseAddress) -> bool:
    for entry in settings.WARDEN_WEBHOOK_ALLOWED_HOSTS:
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a hostname that is not this one
    return False


def _why_not(address: ipaddress._BaseAddress) -> str:
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if address.is_unspecified or address.is_reserved:
        return "a reserved address"
    return ""


def webhook_target(url: str) -> Target:
    """The address a delivery to `url` connects to, or TargetRefused saying why not (in words for
    the desk). Every address the host resolves to must be allowed: a name with one public and
    one private address is refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("a webhook URL is http:// or https:// with a host")
    host = parts.hostname
    try:
        infos = socket.getaddrinfo(host, parts.port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise TargetRefused(f"{host} does not resolve ({error})") from None
    addresses = []
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        if (why := _why_not(address)) and not _allowed(host, address):
            raise TargetRefused(f"{host} is {why} ({address}); webhooks go to public receivers only, unless "
                                "WARDEN_WEBHOOK_ALLOWED_HOSTS names it")
        addresses.append(address)
    return Target(host=host, address=str(addresses[0]))


def webhook_url_refusal(url: str) -> str:
    """'' when `url` may receive webhooks now; otherwise why not."""
    try:
        webhook_target(url)
    except TargetRefused as refused:
        return str(refused)
    return ""

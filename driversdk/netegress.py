"""Egress for a bridge of ours: what Nomad's CNI bridge plugin (``ipMasq``, ``isGateway``) and
firewall plugin give its ``nomad`` bridge, so a task in a bridge-mode group reaches beyond the host
(a package mirror, an API, another machine), not only its peers and the host's forwarded ports.

- IPv4 forwarding is on (``net.ipv4.ip_forward``), as the bridge plugin's gateway mode sets it;
- traffic from the bridge's subnet that leaves through any other interface is masqueraded
  (``nat POSTROUTING``), so replies find their way back without a route to the subnet;
- forwarding out of the bridge, and replies back into it, is accepted (``filter FORWARD``): Docker
  sets that chain's policy to DROP.

The rules are Docker's own for ``docker0``, applied to our bridge, each carrying the comment
``driversdk egress <bridge>``; they are made with the bridge and removed with it. Forwarding is
left on when the bridge goes, as the CNI plugins leave it: other software may rely on it.
"""

from __future__ import annotations

import ipaddress
import subprocess

from driversdk.errors import DriverSDKError

IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"


class EgressFailed(DriverSDKError):
    """The bridge's way out could not be set up."""


def tag(bridge: str) -> str:
    return f"driversdk egress {bridge}"


def _rules(bridge: str, subnet: ipaddress.IPv4Network) -> list[tuple[str, str, list[str]]]:
    """(table, chain, rule) for one bridge."""
    comment = ["-m", "comment", "--comment", tag(bridge)]
    return [
        ("nat", "POSTROUTING", ["-s", str(subnet), "!", "-o", bridge, *comment, "-j", "MASQUERADE"]),
        ("filter", "FORWARD", ["-i", bridge, "!", "-o", bridge, *comment, "-j", "ACCEPT"]),
        ("filter", "FORWARD", ["-o", bridge, "!", "-i", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                               *comment, "-j", "ACCEPT"]),
    ]  # fmt: skip


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise EgressFailed(
            "iptables is not installed, and bridge networking needs it to let tasks reach beyond the host; "
            "install it (apt-get install iptables)"
        ) from None


def allow(bridge: str, subnet: str | ipaddress.IPv4Network) -> None:
    """Let namespaces on ``bridge`` reach beyond the host; idempotent. On failure, the rules this
    call inserted are removed again (those already there serve other allocations on the bridge)."""
    network = ipaddress.IPv4Network(subnet)
    inserted: list[tuple[str, str, list[str]]] = []
    try:
        _forwarding_on()
        for table, chain, rule in _rules(bridge, network):
            if _iptables("-t", table, "-C", chain, *rule).returncode == 0:
                continue
            # Inserted first: Docker's FORWARD rules end in its DROP policy.
            done = _iptables("-t", table, "-I", chain, "1", *rule)
            if done.returncode != 0:
                raise EgressFailed(
                    f"could not let bridge {bridge} reach beyond the host: iptables -t {table} -I {chain} failed: "
                    f"{done.stderr.strip() or done.returncode}"
                )
            inserted.append((table, chain, rule))
    except BaseException:
        for table, chain, rule in inserted:
            _iptables("-t", table, "-D", chain, *rule)
        raise


def remove(bridge: str, subnet: str | ipaddress.IPv4Network) -> list[str]:
    """Remove the bridge's egress rules (every copy); returns what could not be removed."""
    network = ipaddress.IPv4Network(subnet)
    failed: list[str] = []
    for table, chain, rule in _rules(bridge, network):
        try:
            while _iptables("-t", table, "-C", chain, *rule).returncode == 0:
                done = _iptables("-t", table, "-D", chain, *rule)
                if done.returncode != 0:
                    failed.append(f"{table} {chain}: {done.stderr.strip() or done.returncode}")
                    break
        except EgressFailed:  # no iptables: no rule of ours can be there
            return failed
    return failed


def rules_of(bridge: str) -> list[str]:
    """The egress rules ``bridge`` has now, as ``iptables -S`` prints them (for status and tests)."""
    out: list[str] = []
    for table in ("nat", "filter"):
        try:
            done = _iptables("-t", table, "-S")
        except EgressFailed:
            return []
        out += [line for line in done.stdout.splitlines() if f'"{tag(bridge)}"' in line]
    return out


def _forwarding_on() -> None:
    try:
        with open(IP_FORWARD) as fh:
            if fh.read().strip() == "1":
                return
        with open(IP_FORWARD, "w") as fh:
            fh.write("1")
    except OSError as err:
        raise EgressFailed(
            f"could not turn on IPv4 forwarding ({IP_FORWARD}: {err.strerror}), which bridge networking needs "
            "for tasks to reach beyond the host; run as root, or set net.ipv4.ip_forward = 1"
        ) from None

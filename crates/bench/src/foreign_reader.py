# A catch-up reader that is not ours (run by `oncelog-bench read --foreign`, one process per
# reader): it reads one stream from offset -1 until a response says Stream-Up-To-Date, following
# Stream-Next-Offset, and prints one JSON line {"bytes": N, "requests": N}.
#
#   python3 foreign_reader.py python URL   # http.client on one keep-alive connection, the body
#                                          # read 1 MiB at a time as it streams in
#   python3 foreign_reader.py curl URL     # `curl` once per request (a new process and a new
#                                          # connection each), its body counted by curl itself
#
# Why these two: they are what users reach for first, and unlike the benchmark's own reader they
# pay for every response the server splits a stream into (a curl process per request) and for
# the body's framing (http.client decodes chunked bodies in Python).
import http.client
import json
import subprocess
import sys
import urllib.parse


def fail(msg):
    print(f"foreign reader: {msg}", file=sys.stderr)
    sys.exit(1)


def with_offset(path, offset):
    return f"{path}?offset={urllib.parse.quote(offset, safe='')}"


def read_python(url):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
    offset, total, requests = "-1", 0, 0
    while True:
        conn.request("GET", with_offset(u.path, offset))
        resp = conn.getresponse()
        if resp.status != 200:
            fail(f"GET offset {offset}: status {resp.status}")
        while True:
            piece = resp.read(1 << 20)
            if not piece:
                break
            total += len(piece)
        requests += 1
        offset = resp.getheader("Stream-Next-Offset") or fail("no Stream-Next-Offset")
        if (resp.getheader("Stream-Up-To-Date") or "").lower() == "true":
            return total, requests


def read_curl(url):
    offset, total, requests = "-1", 0, 0
    while True:
        # -D - writes the head to stdout, -w then appends the body's size; the body is dropped.
        out = subprocess.run(
            ["curl", "-sS", "--max-time", "60", "-D", "-", "-o", "/dev/null", "-w", "size=%{size_download}\n",
             with_offset(url, offset)],
            capture_output=True, text=True, check=False)
        if out.returncode != 0:
            fail(f"curl offset {offset}: exit {out.returncode}: {out.stderr.strip()}")
        headers, size, status = {}, None, None
        for line in out.stdout.splitlines():
            if line.startswith("HTTP/"):
                status = line.split()[1]
            elif line.startswith("size="):
                size = int(line[5:])
            elif ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        if status != "200" or size is None:
            fail(f"curl offset {offset}: status {status}")
        total += size
        requests += 1
        offset = headers.get("stream-next-offset") or fail("no Stream-Next-Offset")
        if headers.get("stream-up-to-date", "").lower() == "true":
            return total, requests


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("python", "curl"):
        fail("usage: foreign_reader.py python|curl URL")
    read = read_python if sys.argv[1] == "python" else read_curl
    total, requests = read(sys.argv[2])
    print(json.dumps({"bytes": total, "requests": requests}))


main()

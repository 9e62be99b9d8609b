"""What every benchmark peer of ferry shares (benchmarks/peer_process.h, the C++ side).

A peer prints a ready line, then answers one JSON line per request line on stdin. Only the
answers go to stdout: whatever the libraries print (imports, JIT builds, logging) is sent
to stderr, which the C++ side keeps and quotes when the peer fails. A request that fails is
answered {"error": "Type: message"}; the peer goes on to the next.
"""
import json
import os
import sys


def claim_stdout():
    """Keeps the real stdout for the answers and points fd 1 (and sys.stdout) at stderr.
    Call it first, before importing the libraries that print."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(out, hello, answer):
    """Says {"ready": true, **hello}, then answer(request) -> dict for each request line."""

    def say(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    say(dict({"ready": True}, **hello))
    for line in sys.stdin:
        try:
            say(answer(json.loads(line)))
        except Exception as e:  # noqa: BLE001: answered, not fatal; the C++ side names the peer
            say({"error": "%s: %s" % (type(e).__name__, e)})

"""The voice server under load and under hostile clients, and `speak --raw`'s first audio and speed.

    python benchmarks/serve.py                          # a demo-size voice (untrained weights) in .bench/serve
    python benchmarks/serve.py --voice runs/demo/export # a trained voice of yours

Without --voice the benchmark makes the voice benchmarks/export.py measures: the demo's FastPitch and
vocoder (--vocoder, default source_filter, the product's default) sizes with initial weights (the
duration predictor set to 6 frames a token, about real speech), exported as `snakemake export` does;
speed does not depend on trained weights.

Server (`python -m pipeline.serve`, its defaults: 2 model calls at a time, 32 queued, on a free
127.0.0.1 port; the clients are threads of this process, over loopback only):
  1. load: REQUESTS one-sentence POST /synthesize from CLIENTS concurrent clients: errors (target 0),
     p50 / p95 latency (target p95 <= 1 s), seconds of audio served per wall second, and the server's
     CPU seconds per request (a figure other processes on the machine do not inflate as much);
  2. streamed first chunk: STREAMS sequential ?stream=true requests of three sentences, time to the
     first audio bytes (target <= 0.5 s);
  3. hostile clients, each answered or dropped cleanly: invalid JSON, a 1 MB body, an unknown
     speaker, NaN and negative pace, an entity bomb and a nesting bomb, half a request then silence,
     half a body then silence, a client gone mid-stream; then /health must be 200 and the server's
     resident memory back near where it was before them.
speak: `python -m pipeline.speak --raw` of a 10-sentence paragraph on stdin: first audio bytes after
the model is loaded (its "loaded" line; target <= 0.5 s) and the real-time factor of the whole
paragraph from then (target <= 0.05). Prints a Markdown table; writes {workdir}/serve.json.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402

REQUESTS, CLIENTS, STREAMS = 200, 16, 10
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Printing differs from most of the arts and crafts.",
             "A voice server answers many people at once.", "She sells sea shells by the sea shore.",
             "Every request here is one short sentence."]
PARAGRAPH = ("The first printed books were made in Germany. They copied the hand of the scribes. "
             "Soon the printers made types of their own. Some of them were very beautiful. "
             "Others were plain and easy to read. The art spread to Italy within twenty years. "
             "There it found a lighter and rounder letter. Printers in Venice made it famous. "
             "Their books were small enough to carry. Readers liked them at once.")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def call(port, method, path, body=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body if isinstance(body, (bytes, str, type(None))) else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def cpu_s(pid):
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(voice, workers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.serve", "--voice", str(voice), "--port", str(port),
                             "--workers", str(workers)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(600):
        try:
            if call(port, "GET", "/health", timeout=2)[0] == 200:
                return proc, port
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the server stopped: {proc.stderr.read().decode()[-2000:]}") from None
        time.sleep(0.2)
    raise SystemExit("the server did not answer /health within 120 s")


def load_run(port, sample_rate):
    """REQUESTS one-sentence requests from CLIENTS threads -> figures."""
    latencies, errors, audio_bytes, lock = [], [], [0], threading.Lock()
    jobs = iter(range(REQUESTS))

    def client():
        while True:
            with lock:
                n = next(jobs, None)
            if n is None:
                return
            t0 = time.perf_counter()
            try:
                status, body = call(port, "POST", "/synthesize", {"text": SENTENCES[n % len(SENTENCES)]})
            except OSError as e:
                status, body = None, str(e).encode()
            with lock:
                latencies.append(time.perf_counter() - t0)
                if status == 200:
                    audio_bytes[0] += len(body) - 44
                else:
                    errors.append(f"{status}: {body[:100]!r}")
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=20)
    audio_s = audio_bytes[0] / 2 / sample_rate
    return {"requests": REQUESTS, "clients": CLIENTS, "errors": len(errors), "error_examples": errors[:3],
            "p50_s": statistics.median(latencies), "p95_s": q[18], "max_s": max(latencies), "wall_s": wall,
            "audio_s": audio_s, "audio_s_per_wall_s": audio_s / wall}


def first_chunk(port, text):
    """Seconds from sending a ?stream=true request to its first audio bytes, and the chunks' count."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    data = json.dumps({"text": text}).encode()
    t0 = time.perf_counter()
    sock.sendall(b"POST /synthesize?stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    f = sock.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200"), "the stream was refused"
    while f.readline().strip():
        pass
    chunks, first = 0, None
    while (size := int(f.readline().strip(), 16)):
        f.read(size)
        f.readline()
        first = first if first is not None else time.perf_counter() - t0
        chunks += 1
    sock.close()
    return first, chunks


def raw_exchange(port, data, wait=30, leave_after_first_chunk=False):
    """Send raw bytes -> when and how the server answered (its status line, or that it closed), or
    with leave_after_first_chunk, when the first audio chunk came before this client went away."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=wait)
    t0 = time.perf_counter()
    try:
        sock.sendall(data)
        out, answered = b"", None
        while (chunk := sock.recv(65536)):
            answered = answered or time.perf_counter() - t0
            out += chunk
            if leave_after_first_chunk and b"\r\n\r\n" in out and len(out.split(b"\r\n\r\n", 1)[1]) > 16:
                return f"first audio after {answered:.2f} s, then the client closed"
        closed = time.perf_counter() - t0
        if not out:
            return f"closed by the server after {closed:.1f} s"
        line = out.split(b"\r\n", 1)[0].decode(errors="replace")
        return f"{line} after {answered:.1f} s (closed after {closed:.1f} s)"
    except (TimeoutError, socket.timeout):
        return f"no answer after {wait} s"
    except (BrokenPipeError, ConnectionResetError) as e:
        return f"dropped ({type(e).__name__}) after {time.perf_counter() - t0:.1f} s"
    finally:
        sock.close()


def hostile_run(port, proc):
    """Each hostile client's outcome, /health after, and the server's memory before and after."""
    entity_bomb = ('<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa">'
                   + "".join(f'<!ENTITY {c} "{f"&{p};" * 10}">' for p, c in zip("abcdefgh", "bcdefghi"))
                   + "]><speak>&i;</speak>")
    nest_bomb = "<speak>" + '<prosody rate="fast">' * 3000 + "deep" + "</prosody>" * 3000 + "</speak>"
    post = lambda body: call(port, "POST", "/synthesize", body)  # noqa: E731
    streamed = json.dumps({"text": " ".join(SENTENCES * 3)}).encode()
    head = b"POST /synthesize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    cases = {
        "invalid JSON": lambda: post('{"text": "Hello'),
        "1 MB body": lambda: post({"text": "a" * 1_000_000}),
        "unknown speaker": lambda: post({"text": "Hello.", "speaker": "nobody"}),
        "NaN pace": lambda: post('{"text": "Hello.", "pace": NaN}'),
        "negative pace": lambda: post({"text": "Hello.", "pace": -2}),
        "entity bomb (billion laughs)": lambda: post({"text": entity_bomb}),
        "nesting bomb (3,000 prosody)": lambda: post({"text": nest_bomb}),
        "half a request head, then silence": lambda: raw_exchange(port, head[:30]),
        "half a body, then silence": lambda: raw_exchange(port, head + b'Content-Length: 100\r\n\r\n{"te'),
        "gone mid-stream": lambda: raw_exchange(port, b"POST /synthesize?stream=true" + head[len(b"POST /synthesize"):]
                                                + b"Content-Length: %d\r\n\r\n%s" % (len(streamed), streamed),
                                                leave_after_first_chunk=True),
    }
    before = rss_mb(proc.pid)
    out = {}
    for name, case in cases.items():
        t0 = time.perf_counter()
        try:
            result = case()
            if isinstance(result, tuple):
                status, body = result
                result = f"{status} {body.decode(errors='replace')[:90]}"
        except OSError as e:
            result = f"dropped ({type(e).__name__})"
        out[name] = {"outcome": result, "wall_s": time.perf_counter() - t0}
        log(f"  {name}: {result}")
    time.sleep(2)
    health = call(port, "GET", "/health")
    return {"cases": out, "health_after": health[0], "rss_before_mb": before, "rss_after_mb": rss_mb(proc.pid),
            "alive": proc.poll() is None}


def speak_raw(voice, sample_rate):
    """`speak --raw` of PARAGRAPH: seconds to the first audio bytes after the "loaded" line, and the RTF."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.speak", "--voice", str(voice), "--raw"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    times, size, lines = {}, [0], []

    def read_err():
        for line in proc.stderr:
            lines.append(line.decode().rstrip())
            if b"loaded in" in line:
                times["loaded"] = time.perf_counter()

    def read_out():
        while (chunk := proc.stdout.read1(65536)):
            times.setdefault("first", time.perf_counter())
            size[0] += len(chunk)
        times["end"] = time.perf_counter()
    threads = [threading.Thread(target=read_err), threading.Thread(target=read_out)]
    for t in threads:
        t.start()
    proc.stdin.write(PARAGRAPH.encode() + b"\n")
    proc.stdin.close()
    for t in threads:
        t.join()
    if proc.wait() != 0 or "first" not in times:
        raise SystemExit("speak failed: " + "\n".join(lines[-5:]))
    audio_s = size[0] / 2 / sample_rate
    return {"sentences": PARAGRAPH.count(". ") + 1, "audio_s": audio_s,
            "first_audio_after_load_s": times["first"] - times["loaded"],
            "rtf_after_load": (times["end"] - times["loaded"]) / audio_s, "log": lines[-1]}


def demo_voice(workdir, vocoder):
    from benchmarks.export import demo_run
    from pipeline import config, export
    path, _ = demo_run(workdir, log, vocoder)
    out = workdir / f"voice-{vocoder}"
    if not (out / "export.json").is_file():
        export.export(config.load_config(path, check_paths=False), out, tflite=False, log=log)
    return out


def report(res):
    load, speak, hostile = res["load"], res["speak"], res["hostile"]
    rows = [["load: errors", f"{load['errors']} of {load['requests']} ({load['clients']} clients)", "0"],
            ["load: one-sentence latency p50 / p95", f"{load['p50_s']:.2f} / {load['p95_s']:.2f} s", "p95 <= 1 s"],
            ["load: audio served per wall second", f"{load['audio_s_per_wall_s']:.1f} s/s", ""],
            ["load: server CPU per request (per audio second)",
             f"{load['cpu_s_per_request'] * 1000:.0f} ms ({load['server_cpu_s'] / load['audio_s']:.3f})", ""],
            ["streamed first chunk, median / max", f"{res['stream']['median_s']:.2f} / {res['stream']['max_s']:.2f} s",
             "<= 0.5 s"],
            ["speak --raw: first audio after load", f"{speak['first_audio_after_load_s']:.2f} s", "<= 0.5 s"],
            ["speak --raw: real-time factor (10 sentences)", f"{speak['rtf_after_load']:.3f}", "<= 0.05"],
            ["hostile: /health after, server alive", f"{hostile['health_after']}, {hostile['alive']}", "200, True"],
            ["hostile: server memory before / after",
             f"{hostile['rss_before_mb']:.0f} / {hostile['rss_after_mb']:.0f} MB", "near"]]
    print(common.table(rows, ["figure", "result", "target"]))
    print()
    print(common.table([[k, v["outcome"]] for k, v in hostile["cases"].items()], ["hostile client", "outcome"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voice", help="an export folder (default: a demo-size voice made in --workdir)")
    parser.add_argument("--vocoder", default="source_filter", choices=["source_filter", "vocos", "hifigan", "griffin_lim"],
                        help="the demo-size voice's vocoder kind, without --voice")
    parser.add_argument("--workdir", default=str(common.DEFAULT_WORKDIR / "serve"))
    parser.add_argument("--workers", type=int, default=2, help="the server's --workers (model calls at a time)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    voice = Path(args.voice) if args.voice else demo_voice(workdir, args.vocoder)
    sample_rate = json.loads((voice / "export.json").read_text())["sample_rate"]
    machine, load_start = common.machine_info(), os.getloadavg()[0]
    log("speak --raw ...")
    res = {"voice": str(voice), "workers": args.workers, "speak": speak_raw(voice, sample_rate)}
    proc, port = start_server(voice, args.workers)
    try:
        call(port, "POST", "/synthesize", {"text": SENTENCES[0]})                # one warm request
        log("load ...")
        cpu0 = cpu_s(proc.pid)
        res["load"] = load_run(port, sample_rate)
        res["load"]["server_cpu_s"] = cpu_s(proc.pid) - cpu0       # what the requests cost, whatever else runs
        res["load"]["cpu_s_per_request"] = res["load"]["server_cpu_s"] / REQUESTS
        log("streams ...")
        firsts = [first_chunk(port, " ".join(SENTENCES[:3]))[0] for _ in range(STREAMS)]
        res["stream"] = {"median_s": statistics.median(firsts), "max_s": max(firsts), "runs": STREAMS}
        res["rss_after_load_mb"] = rss_mb(proc.pid)
        log("hostile clients ...")
        res["hostile"] = hostile_run(port, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    res["machine"], res["loadavg"] = machine, [load_start, os.getloadavg()[0]]
    print(f"machine: {common.machine_line(machine)}; load average {load_start:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end; voice {voice}; server --workers {args.workers}")
    report(res)
    common.write_json(workdir / "serve.json", res)


if __name__ == "__main__":
    main()

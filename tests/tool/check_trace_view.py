"""`devbuf trace view` in a real browser. Headless Chromium, driven through the DevTools
protocol over a pipe (no library), loads the page and is used as a person would use it:
- the figures it shows equal what `devbuf trace replay --json` prints, for devbuf's policy
  and for the CCA model (`--policy cca`), side by side in two panels;
- axis ticks in bytes and in events, and in time where the trace has `# t` lines;
- the pointer over a band shows that allocation's number, size and lifetime (the band under
  the pointer is computed here from the trace itself), and its stack from `# frame` lines;
- the wheel and a drag zoom in, a double-click zooms out;
- a click shows what each segment held at that moment: the bytes in use equal the trace's
  live bytes then, and the reserved bytes at the peak equal the replay's peak;
- a spike of one event among 20,000 shows in the screenshot, where a sampled chart loses it;
- a path and stack frames holding markup stay text, and the page loads nothing from outside.
Skipped, with the reason, where no Chromium is installed.
- a PyTorch snapshot (a pickle) draws directly, named as given, and hovering one of its
  allocations shows the Python stack the snapshot recorded.
Usage: check_trace_view.py DEVBUF_TOOL TRACE SCRATCH_FOLDER [SNAPSHOT.pickle]
"""
import base64
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib

tool, trace, scratch = sys.argv[1:4]
snapshot = sys.argv[4] if len(sys.argv) > 4 else None
browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if not browser:
    print("SKIP: no Chromium to render the page (Debian: apt-get install chromium)")
    sys.exit(77)
shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
failures = []
WIDTH, HEIGHT = 1400, 900


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)
    return condition


def above_four(fd):
    """The same pipe end at a number above 4, so that moving it to 3 or 4 in the child
    never closes the other one."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    """The DevTools protocol over --remote-debugging-pipe: JSON messages ending in a NUL byte,
    commands on the browser's fd 3, answers and events on its fd 4."""

    def __init__(self):
        to_browser, self.commands = os.pipe()
        self.answers, from_browser = os.pipe()
        to_browser, from_browser = above_four(to_browser), above_four(from_browser)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                 "--user-data-dir=" + os.path.join(scratch, "profile"), f"--window-size={WIDTH},{HEIGHT}"]
        self.process = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser} {to_browser}<&- {from_browser}>&-',
             browser, *flags, "about:blank"],
            pass_fds=(to_browser, from_browser), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self.buffer = b""
        self.next_id = 0
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)

    def call(self, method, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.answers, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the pipe during {method}")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path):
        self.call("Page.navigate", url="file://" + os.path.abspath(path))
        for _ in range(600):
            if self.evaluate("document.body && document.body.dataset.ready === '1'"):
                return True
            time.sleep(0.05)
        return False

    def mouse(self, kind, x, y, **extra):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def click(self, x, y, count=1):
        self.mouse("mouseMoved", x, y)
        for kind in ("mousePressed", "mouseReleased"):
            self.mouse(kind, x, y, button="left", clickCount=count)

    def screenshot(self, name):
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        with open(os.path.join(scratch, name), "wb") as f: # kept, for a person to look at
            f.write(data)
        return data

    def close(self):
        self.session = None
        try:
            self.call("Browser.close")
        except RuntimeError:
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def png_pixels(data):
    """(width, height, rows of RGB(A) bytes) of an 8-bit PNG, its filters undone."""
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    channels = {2: 3, 6: 4}[colour]
    chunks, at = [], 8
    while at < len(data):
        length = struct.unpack(">I", data[at:at + 4])[0]
        if data[at + 4:at + 8] == b"IDAT":
            chunks.append(data[at + 8:at + 8 + length])
        at += 12 + length
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def pixel(image, x, y):
    width, height, channels, rows = image
    return tuple(rows[int(y)][int(x) * channels:int(x) * channels + 3])


def read_trace(path):
    """(size, born, died) per allocation, died = event count when never freed."""
    allocations, events = [], 0
    for line in open(path):
        fields = line.split()
        if fields and fields[0] == "a":
            allocations.append([int(fields[2]), events, None])
            events += 1
        elif fields and fields[0] == "f":
            allocations[int(fields[1]) - 1][2] = events
            events += 1
    for a in allocations:
        if a[2] is None:
            a[2] = events
    return allocations, events


def live_at(allocations, event):
    return sum(size for size, born, died in allocations if born <= event < died)


def replay(path, *options):
    result = subprocess.run([tool, "trace", "replay", path, "--json", *options], capture_output=True, text=True)
    expect(result.returncode == 0, f"replay {path} {options}: {result.stderr}")
    return json.loads(result.stdout) if result.returncode == 0 else {}


def draw(path, page):
    result = subprocess.run([tool, "trace", "view", path, "-o", page], capture_output=True, text=True)
    expect(result.returncode == 0, f"trace view {path}: exit {result.returncode}: {result.stderr}")
    html = open(page, encoding="utf-8").read()
    expect(not re.search(r"\ssrc=|<link|\shref=|url\(|@import|fetch\(|XMLHttpRequest|WebSocket|import\(", html),
           "the page loads nothing from outside")
    return html


def chart_geometry(chromium, policy):
    """The chart's plot area in page pixels, and the events and bytes it spans."""
    return chromium.evaluate(f"""(() => {{
        const chart = document.querySelector('#panel-{policy} .chart'), box = chart.getBoundingClientRect();
        const d = chart.dataset;
        return {{left: box.left + Number(d.left), top: box.top + Number(d.top), width: Number(d.width),
                 height: Number(d.height), from: Number(d.from), to: Number(d.to), topBytes: Number(d.topBytes),
                 bottomBytes: Number(d.bottomBytes)}};
    }})()""")


def y_of(g, value):
    return g["top"] + g["height"] * (1 - (value - g["bottomBytes"]) / (g["topBytes"] - g["bottomBytes"]))


def column_sample(g, column):
    """The event a column shows (the state after it): its middle, as the page's help says."""
    span = g["to"] - g["from"]
    x0, x1 = g["from"] + column * span / g["width"], g["from"] + (column + 1) * span / g["width"]
    return min(int((x0 + x1) // 2), int(g["to"]) - 1)


tip = "document.getElementById('tip').hidden ? '' : document.getElementById('tip').textContent"
chromium = Chromium()
try:
    # ---- a real trace: figures, panels, ticks, hover, zoom, segments -------------------------
    page = os.path.join(scratch, "trace.html")
    draw(trace, page)
    mine, theirs = replay(trace), replay(trace, "--policy", "cca")
    allocations, events = read_trace(trace)
    expect(chromium.open(page), "the page's script ran to the end")
    shown = chromium.evaluate("Object.fromEntries([...document.querySelectorAll('.figure')].map(s => [s.id, Number(s.dataset.value)]))")
    expect(shown.get("peak-live") == mine.get("peak_requested_bytes"), f"peak live {shown.get('peak-live')} against replay's {mine.get('peak_requested_bytes')}")
    expect(shown.get("peak-reserved") == mine.get("peak_reserved_bytes"), f"peak reserved {shown.get('peak-reserved')} against {mine.get('peak_reserved_bytes')}")
    expect(shown.get("devbuf-system-allocs") == mine.get("system_allocs"), f"devbuf system allocations {shown.get('devbuf-system-allocs')}")
    expect(shown.get("cca-peak-reserved") == theirs.get("peak_reserved_bytes"), f"CCA peak reserved {shown.get('cca-peak-reserved')} against {theirs.get('peak_reserved_bytes')}")
    expect(shown.get("cca-system-allocs") == theirs.get("system_allocs"), f"CCA system allocations {shown.get('cca-system-allocs')}")
    for policy in ("devbuf", "cca"):
        bands = chromium.evaluate(f"document.querySelectorAll('#panel-{policy} .chart [data-allocation]').length")
        expect(bands >= 100, f"{policy}: {bands} allocations in colour")
    ticks = chromium.evaluate("[...document.querySelectorAll('#panel-devbuf .x-tick')].map(t => t.textContent)")
    numbers = [int(t.replace(",", "")) for t in ticks]
    expect(len(numbers) >= 4 and numbers == sorted(numbers) and numbers[-1] <= events, f"event ticks {ticks}")
    y_ticks = chromium.evaluate("[...document.querySelectorAll('#panel-devbuf .y-tick')].map(t => t.textContent)")
    expect(len(y_ticks) >= 4 and all(re.fullmatch(r"[\d.]+ (B|KiB|MiB|GiB|TiB)", t) for t in y_ticks), f"byte ticks {y_ticks}")

    # The largest allocation by bytes x events: the pointer at the middle of its band.
    g = chart_geometry(chromium, "devbuf")
    target = max(range(len(allocations)), key=lambda i: allocations[i][0] * (allocations[i][2] - allocations[i][1]))
    size, born, died = allocations[target]
    middle_event = (born + died) // 2
    column = int((middle_event + 0.5 - g["from"]) / (g["to"] - g["from"]) * g["width"])
    sample = column_sample(g, column)
    base = sum(s for s, b, d in allocations[:target] if b <= sample < d)
    x = g["left"] + column + 0.5
    y = y_of(g, base + size / 2)
    chromium.mouse("mouseMoved", x, y)
    words = chromium.evaluate(tip)
    expect(words.startswith(f"allocation {target + 1}: ") and f"({size:,} bytes)" in words and f"from event {born:,} to" in words,
           f"hover over allocation {target + 1} ({size} bytes, events {born}..{died}) shows {words!r}")
    chromium.mouse("mouseMoved", x, g["top"] + 2)
    words = chromium.evaluate(tip)
    expect(words.startswith("after event") and "reserved" in words, f"hover above the bands shows {words!r}")

    # Zoom: the wheel three times at that point, then a drag, then a double-click.
    for _ in range(3):
        chromium.mouse("mouseWheel", x, y, deltaX=0, deltaY=-120)
    zoomed = chart_geometry(chromium, "devbuf")
    pointed = g["from"] + (column + 0.5) / g["width"] * (g["to"] - g["from"])
    expect(zoomed["to"] - zoomed["from"] < 0.6 * (g["to"] - g["from"]) and zoomed["from"] <= pointed <= zoomed["to"],
           f"the wheel zoomed {g['from']}..{g['to']} to {zoomed['from']}..{zoomed['to']} around event {pointed:.0f}")
    other = chart_geometry(chromium, "cca")
    expect((other["from"], other["to"]) == (zoomed["from"], zoomed["to"]), "both panels show the same events")
    # Zoomed in, the byte axis starts near the least live bytes in view; a band there still
    # names its allocation.
    expect(zoomed["bottomBytes"] > 0, f"zoomed in, the byte axis still starts at {zoomed['bottomBytes']}")
    column = zoomed["width"] // 2
    sample = column_sample(zoomed, column)
    stacked, below = [], 0
    for i, (s, b, d) in enumerate(allocations):
        if b <= sample < d:
            stacked.append((i, below, s))
            below += s
    visible = [entry for entry in stacked if entry[1] >= zoomed["bottomBytes"]]
    if expect(visible, f"an allocation above {zoomed['bottomBytes']} bytes after event {sample}"):
        i, base_i, size_i = max(visible, key=lambda entry: entry[2])
        chromium.mouse("mouseMoved", zoomed["left"] + column + 0.5, y_of(zoomed, base_i + size_i / 2))
        words = chromium.evaluate(tip)
        expect(words.startswith(f"allocation {i + 1}: "), f"zoomed, hover over allocation {i + 1} shows {words!r}")
    zoomed_ticks = chromium.evaluate("[...document.querySelectorAll('#panel-devbuf .x-tick')].map(t => t.textContent)")
    expect(zoomed_ticks != ticks and len(zoomed_ticks) >= 4, f"ticks after zooming {zoomed_ticks}")
    x0, x1 = zoomed["left"] + 100, zoomed["left"] + 300
    chromium.mouse("mouseMoved", x0, y)
    chromium.mouse("mousePressed", x0, y, button="left", clickCount=1)
    chromium.mouse("mouseMoved", x1, y, buttons=1)
    chromium.mouse("mouseReleased", x1, y, button="left", clickCount=1)
    dragged = chart_geometry(chromium, "devbuf")
    span = zoomed["to"] - zoomed["from"]
    want = (zoomed["from"] + 100 / zoomed["width"] * span, zoomed["from"] + 300 / zoomed["width"] * span)
    expect(abs(dragged["from"] - want[0]) < 1 and abs(dragged["to"] - want[1]) < 1,
           f"a drag over pixels 100..300 zoomed to {dragged['from']:.1f}..{dragged['to']:.1f}, not {want[0]:.1f}..{want[1]:.1f}")
    chromium.click(x0, y, count=1)
    chromium.click(x0, y, count=2)
    whole = chart_geometry(chromium, "devbuf")
    expect((whole["from"], whole["to"]) == (0, events), f"a double-click shows the whole trace: {whole['from']}..{whole['to']}")

    # Segments: at first the moment of devbuf's peak; then a click at the last column.
    summary = "Object.fromEntries(['devbuf','cca'].map(p => [p, Object.assign({}, document.querySelector('#panel-' + p + ' .segment-summary').dataset)]))"
    state = chromium.evaluate(summary)
    moment = int(state["devbuf"]["event"])
    expect(int(state["devbuf"]["reserved"]) == mine.get("peak_reserved_bytes"),
           f"devbuf's segments at its peak hold {state['devbuf']['reserved']}, the replay's peak is {mine.get('peak_reserved_bytes')}")
    for policy in ("devbuf", "cca"):
        expect(int(state[policy]["used"]) == live_at(allocations, moment),
               f"{policy}: {state[policy]['used']} bytes in use after event {moment}, the trace has {live_at(allocations, moment)} live")
    blocks = chromium.evaluate("new Set([...document.querySelectorAll('#panel-devbuf .segments [data-allocation]')].map(r => r.dataset.allocation)).size")
    alive = sum(1 for s, b, d in allocations if b <= moment < d)
    expect(blocks == alive, f"the segment view shows {blocks} allocations, {alive} are live after event {moment}")
    chromium.click(whole["left"] + whole["width"] - 0.5, whole["top"] + whole["height"] / 2)
    state = chromium.evaluate(summary)
    last = column_sample(whole, whole["width"] - 1)
    expect(int(state["cca"]["event"]) == last, f"a click at the last column chose event {state['cca']['event']}, not {last}")
    expect(int(state["cca"]["reserved"]) == theirs.get("peak_reserved_bytes") and int(state["cca"]["segments"]) == theirs.get("system_allocs"),
           f"the CCA model, which never gives a segment back without a limit, holds {state['cca']['segments']} segments of "
           f"{state['cca']['reserved']} bytes at the end: its replay made {theirs.get('system_allocs')} of {theirs.get('peak_reserved_bytes')}")
    for policy in ("devbuf", "cca"):
        expect(int(state[policy]["used"]) == live_at(allocations, last), f"{policy}: in use after event {last}")
    chromium.mouse("mouseMoved", 1, 1)
    image = png_pixels(chromium.screenshot("trace.png"))
    expect(image[:2] == (WIDTH, HEIGHT), f"screenshot of {image[0]}x{image[1]}")
    colours = len({pixel(image, x, y) for x in range(0, WIDTH, 7) for y in range(0, HEIGHT, 11)})
    expect(colours > 20, f"the screenshot has {colours} colours: blank?")

    # ---- under a memory limit: each policy's refusals, marked where they happened ------------
    limit = str(mine.get("peak_requested_bytes", 0) * 9 // 10)
    page = os.path.join(scratch, "limit.html")
    result = subprocess.run([tool, "trace", "view", trace, "-o", page, "--memory-limit", limit], capture_output=True, text=True)
    expect(result.returncode == 0, f"trace view --memory-limit {limit}: {result.stderr}")
    expect(chromium.open(page), "the page under a limit runs its script")
    for policy, options in (("devbuf", ()), ("cca", ("--policy", "cca"))):
        refused = replay(trace, "--memory-limit", limit, *options).get("refused")
        marks = chromium.evaluate(f"document.querySelectorAll('#panel-{policy} .chart .refused').length")
        shown = chromium.evaluate(f"Number(document.getElementById('{policy}-refused').dataset.value)")
        expect(refused and marks == refused == shown,
               f"{policy} under a limit of {limit}: {marks} marks, {shown} in the figures, the replay refuses {refused}")

    # ---- a synthetic trace: a spike of one event, time, stacks, markup in names --------------
    MiB = 1 << 20
    lines = ["# devbuf trace 1", "# frame model.py:12 forward", "# frame </script><b>train.py:40</b> step", "# t 1000000", "a 1 16777216"]
    # Long-lived allocations that cover more bytes x events than the spike, so that it is not
    # among those drawn in colour: only the grey of the highest live bytes can show it.
    lines += [f"a {i} 8192" for i in range(2, 252)]
    # The spike's bytes are cached from the start: it changes live bytes only, not reserved.
    lines += [f"a 252 {64 * MiB}", "f 252"]
    next_id, clock = 253, 1000000
    for i in range(10000):
        clock += 250
        if i == 5000:
            lines += [f"# t {clock}", f"a {next_id} {64 * MiB}", f"# t {clock + 1}", f"f {next_id}"]
            spike_event = 253 + 2 * i
        else:
            lines += [f"# t {clock}", f"a {next_id} 4096", f"# t {clock + 100}", f"f {next_id}"]
        next_id += 1
    hostile_name = os.path.join(scratch, "run<!--<script>document.title='owned'<b>&amp;.trace")
    with open(hostile_name, "w") as f:
        f.write("\n".join(lines) + "\n")
    page = os.path.join(scratch, "spike.html")
    html = draw(hostile_name, page)
    expect("</script><b>" not in html and "<script>document.title" not in html and "<!--" not in html,
           "markup from the path and frames stays text")
    expect(chromium.open(page), "the page of a path with markup still runs its script")
    expect(chromium.evaluate("document.title").startswith("devbuf trace: "), "the title is the page's own")
    expect("run<!--<script>document.title='owned'<b>&amp;.trace" in chromium.evaluate("document.querySelector('h1').textContent"),
           "the path shows as it is")
    time_ticks = chromium.evaluate("[...document.querySelectorAll('#panel-devbuf .time-tick')].map(t => t.textContent)")
    expect(len(time_ticks) >= 4 and all(re.fullmatch(r"[\d.]+ (µs|ms|s|min)", t) for t in time_ticks), f"time ticks {time_ticks}")
    g = chart_geometry(chromium, "devbuf")
    chromium.mouse("mouseMoved", g["left"] + 50.5, y_of(g, 8 * MiB))
    words = chromium.evaluate(tip)
    expect(words.startswith("allocation 1: 16 MiB") and "stack:\n  model.py:12 forward\n  </script><b>train.py:40</b> step" in words
           and "allocated at 0 µs" in words, f"hover over the first allocation shows {words!r}")
    chromium.mouse("mouseMoved", 1, 1)
    image = png_pixels(chromium.screenshot("spike.png"))
    spike_x = g["left"] + (spike_event + 0.5 - g["from"]) / (g["to"] - g["from"]) * g["width"]
    spike_y = y_of(g, 48 * MiB)
    background = pixel(image, 5, 5)
    at_spike = [pixel(image, spike_x + dx, spike_y) for dx in (-1, 0, 1)]
    expect(any(p != background for p in at_spike), f"the one-event spike shows at x {spike_x:.0f}: {at_spike}")
    away = [pixel(image, spike_x + dx, spike_y) for dx in (-60, 60)]
    expect(all(p == background for p in away), f"and only there: {away} against {background}")

    # ---- a PyTorch snapshot, read as it is ---------------------------------------------------
    if snapshot:
        page = os.path.join(scratch, "snapshot.html")
        html = draw(snapshot, page)
        data = json.loads(re.search(r'<script type="application/json" id="trace-data">\n(.*?)\n</script>', html, re.S).group(1))
        flat = data["allocations"]
        allocations = [flat[i:i + 3] for i in range(0, len(flat), 3)]
        stacks = {entry[0]: entry[1:] for entry in data["stacks"]}
        expect(len(stacks) > 100 and all(frame.split(":")[0].endswith(".py") for stack in stacks.values() for frame in stack),
               f"{len(stacks)} allocations carry their Python stacks")
        expect(chromium.open(page), "the snapshot's page runs its script")
        expect(os.path.basename(snapshot) in chromium.evaluate("document.querySelector('h1').textContent"),
               "the page names the snapshot, not a converted file")
        target = max(stacks, key=lambda i: allocations[i][0] * (allocations[i][2] - allocations[i][1]))
        size, born, died = allocations[target]
        middle = (born + died) // 2
        # Zoomed in around it, the byte axis starts near the live bytes there: its band is tall.
        for _ in range(8):
            g = chart_geometry(chromium, "devbuf")
            x = g["left"] + (middle + 0.5 - g["from"]) / (g["to"] - g["from"]) * g["width"]
            chromium.mouse("mouseWheel", x, g["top"] + 10, deltaX=0, deltaY=-120)
        g = chart_geometry(chromium, "devbuf")
        column = int((middle + 0.5 - g["from"]) / (g["to"] - g["from"]) * g["width"])
        sample = column_sample(g, column)
        base = sum(s for s, b, d in allocations[:target] if b <= sample < d)
        tall = y_of(g, base) - y_of(g, base + size)
        if expect(born <= sample < died and tall >= 2, f"allocation {target + 1} is live at the event its column "
                  f"shows ({born} <= {sample} < {died}), {tall:.1f} pixels tall"):
            chromium.mouse("mouseMoved", g["left"] + column + 0.5, y_of(g, base + size / 2))
            words = chromium.evaluate(tip)
            expect(words.startswith(f"allocation {target + 1}: ") and "stack:\n  " + stacks[target][0] in words,
                   f"hover over allocation {target + 1} shows {words!r}")
finally:
    chromium.close()
print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)

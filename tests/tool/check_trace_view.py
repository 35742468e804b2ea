"""`devbuf trace view` in a real browser: headless Chromium renders the page drawn from a
real trace of the repository's test data (a screenshot that is not blank), the figures
the page shows (peak live, peak reserved) equal what `devbuf trace replay --json` prints,
every drawn allocation carries its size and lifetime for hovering, and the page loads
nothing from outside (no script, no link, no source). Skipped, with the reason, where no
Chromium is installed. Usage: check_trace_view.py DEVBUF_TOOL TRACE SCRATCH_FOLDER
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

tool, trace, scratch = sys.argv[1:4]
browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if not browser:
    print("SKIP: no Chromium to render the page (Debian: apt-get install chromium)")
    sys.exit(77)
shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
page = os.path.join(scratch, "trace.html")
failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)


result = subprocess.run([tool, "trace", "view", trace, "-o", page], capture_output=True, text=True)
expect(result.returncode == 0, f"trace view: exit {result.returncode}: {result.stderr}")
replayed = json.loads(subprocess.run([tool, "trace", "replay", trace, "--json"], capture_output=True,
                                     text=True).stdout)
html = open(page, encoding="utf-8").read()
expect(not re.search(r"<script|<link|\ssrc=|\shref=|url\(|@import", html), "the page loads nothing from outside")
titles = re.findall(r"<title>allocation (\d+): (\d+) bytes, from event (\d+) to", html)
expect(len(titles) >= 100, f"{len(titles)} allocations carry their size and lifetime")

# The figures as the browser has them, after rendering.
flags = ["--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + os.path.join(scratch, "profile")]
dom = subprocess.run([browser, *flags, "--dump-dom", "file://" + page], capture_output=True, text=True,
                     timeout=120).stdout
shown = dict(re.findall(r'id="(peak-live|peak-reserved)" data-bytes="(\d+)"', dom))
expect(int(shown.get("peak-live", -1)) == replayed["peak_requested_bytes"],
       f"peak live {shown.get('peak-live')} against replay's {replayed['peak_requested_bytes']}")
expect(int(shown.get("peak-reserved", -1)) == replayed["peak_reserved_bytes"],
       f"peak reserved {shown.get('peak-reserved')} against replay's {replayed['peak_reserved_bytes']}")

# The screenshot: a PNG of the window's size whose pixels are not all alike.
shot = os.path.join(scratch, "trace.png")
subprocess.run([browser, *flags, "--screenshot=" + shot, "--window-size=1400,760", "file://" + page],
               capture_output=True, timeout=120)
expect(os.path.exists(shot), "Chromium wrote a screenshot")
if os.path.exists(shot):
    data = open(shot, "rb").read()
    expect(data[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is a PNG")
    width, height = struct.unpack(">II", data[16:24])
    expect((width, height) == (1400, 760), f"screenshot of {width}x{height}")
    chunks, at = [], 8
    while at < len(data):
        length = struct.unpack(">I", data[at:at + 4])[0]
        if data[at + 4:at + 8] == b"IDAT":
            chunks.append(data[at + 8:at + 8 + length])
        at += 12 + length
    pixels = zlib.decompress(b"".join(chunks))
    colours = len(set(pixels[i:i + 3] for i in range(1, len(pixels) - 3, 4 * 97)))
    expect(colours > 20, f"the screenshot has {colours} colours: blank?")
print(f"page {len(html)} bytes, {len(titles)} allocations drawn; {len(failures)} failures")
sys.exit(1 if failures else 0)

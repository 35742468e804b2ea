// The script of the page `devbuf trace view` writes (trace_view.c puts it inline, after the
// trace's data as JSON). It draws, per policy, live bytes stacked by allocation and reserved
// bytes over the events in view, and what each segment held at the chosen moment. Every
// figure it draws follows from the data: live bytes from the allocations' lifetimes,
// reserved bytes from the segments'. Plain DOM and SVG, no library.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("trace-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const DRAWN = 200; // allocations in colour; the rest of the live bytes are grey
  const WIDTH = 640, LEFT = 74, RIGHT = 12, TOP = 10, HEIGHT = 250, BOTTOM = 44;
  const PLOT = WIDTH - LEFT - RIGHT;
  const ROWS = 24, ROW = 12, ROW_GAP = 3; // the segment view: the address space, wrapped
  const events = data.events;
  const count = data.allocations.length / 3;
  const size = new Float64Array(count), born = new Float64Array(count), died = new Float64Array(count);
  for (let i = 0; i < count; i++) {
    size[i] = data.allocations[3 * i];
    born[i] = data.allocations[3 * i + 1];
    died[i] = data.allocations[3 * i + 2];
  }
  // Each event is the allocation or the free of one allocation.
  const eventAllocation = new Int32Array(events), eventFrees = new Uint8Array(events);
  for (let i = 0; i < count; i++) {
    eventAllocation[born[i]] = i;
    if (died[i] < events) { eventAllocation[died[i]] = i; eventFrees[died[i]] = 1; }
  }
  const stacks = new Map();
  for (const entry of data.stacks) stacks.set(entry[0], entry.slice(1));
  const times = data.times;

  const policies = data.policies.map((p) => {
    const segmentCount = p.segments.length / 4;
    const policy = {
      name: p.name, label: p.label, figures: p, segmentCount,
      base: new Float64Array(segmentCount), segmentSize: new Float64Array(segmentCount),
      segmentBorn: new Float64Array(segmentCount), segmentDied: new Float64Array(segmentCount),
      segmentOf: new Int32Array(count), offset: new Float64Array(count),
      live: new Float64Array(events), reserved: new Float64Array(events),
    };
    for (let s = 0; s < segmentCount; s++) {
      policy.base[s] = p.segments[4 * s];
      policy.segmentSize[s] = p.segments[4 * s + 1];
      policy.segmentBorn[s] = p.segments[4 * s + 2];
      policy.segmentDied[s] = p.segments[4 * s + 3];
    }
    for (let i = 0; i < count; i++) {
      policy.segmentOf[i] = p.placements[2 * i];
      policy.offset[i] = p.placements[2 * i + 1];
    }
    // Bytes after each event: live from the allocations, reserved from the segments.
    const reservedChange = new Float64Array(events + 1);
    for (let s = 0; s < segmentCount; s++) {
      reservedChange[Math.min(policy.segmentBorn[s], events)] += policy.segmentSize[s];
      reservedChange[Math.min(policy.segmentDied[s], events)] -= policy.segmentSize[s];
    }
    let live = 0, reserved = 0;
    for (let e = 0; e < events; e++) {
      const i = eventAllocation[e];
      if (policy.segmentOf[i] >= 0) live += eventFrees[e] ? -size[i] : size[i];
      reserved += reservedChange[e];
      policy.live[e] = live;
      policy.reserved[e] = reserved;
    }
    return policy;
  });

  // ---- words and numbers -------------------------------------------------------------------
  function bytes(value) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0, v = value;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    const digits = u === 0 ? 0 : Math.abs(v) >= 100 ? 1 : 2;
    return String(Number(v.toFixed(digits))) + " " + units[u];
  }
  const exact = (value) => Math.round(value).toLocaleString("en-US");
  function duration(microseconds) {
    const m = Math.abs(microseconds);
    if (m < 1000) return microseconds.toFixed(0) + " µs";
    if (m < 1e6) return (microseconds / 1e3).toFixed(m < 1e4 ? 2 : 1) + " ms";
    if (m < 6e7) return (microseconds / 1e6).toFixed(m < 1e7 ? 3 : 2) + " s";
    return (microseconds / 6e7).toFixed(2) + " min";
  }
  const timeAt = (e) => times[Math.max(0, Math.min(events - 1, Math.floor(e)))] - times[0];
  function niceStep(rough) {
    const power = Math.pow(10, Math.floor(Math.log10(rough)));
    const scaled = rough / power;
    return (scaled <= 1 ? 1 : scaled <= 2 ? 2 : scaled <= 5 ? 5 : 10) * power;
  }
  function niceBytesStep(rough) { // 1, 2 or 5 times a unit, or 256 or 512 of it: whole labels
    let unit = 1;
    while (rough / unit >= 1024) unit *= 1024;
    for (const step of [1, 2, 5, 10, 20, 50, 100, 256, 512, 1024]) if (step * unit >= rough) return step * unit;
    return 1024 * unit;
  }
  const hue = (i) => (i * 137) % 360;
  function element(name, attributes, parent) {
    const node = document.createElementNS(SVG, name);
    for (const key in attributes) node.setAttribute(key, attributes[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, words, extra) {
    const node = element("text", Object.assign({ x, y }, extra || {}), parent);
    node.textContent = words;
    return node;
  }

  // ---- the view: the events shown, shared by both policies ---------------------------------
  const view = { from: 0, to: Math.max(events, 1), moment: -1, cursor: -1 };
  const panels = policies.map((policy) => {
    const panel = document.createElement("div");
    panel.className = "panel";
    panel.id = "panel-" + policy.name;
    const title = document.createElement("h2");
    title.textContent = policy.label + ": peak reserved " + bytes(policy.figures.peak_reserved) + ", " +
      policy.figures.system_allocs + " system allocations" +
      (policy.figures.refused ? ", " + policy.figures.refused + " refused" : "");
    panel.appendChild(title);
    const chart = element("svg", { class: "chart", width: WIDTH, height: TOP + HEIGHT + BOTTOM,
      "data-left": LEFT, "data-top": TOP, "data-width": PLOT, "data-height": HEIGHT });
    panel.appendChild(chart);
    const summary = document.createElement("div");
    summary.className = "segment-summary";
    panel.appendChild(summary);
    const segments = element("svg", { class: "segments", width: WIDTH, height: ROWS * (ROW + ROW_GAP) + 4 });
    panel.appendChild(segments);
    document.getElementById("panels").appendChild(panel);
    return { policy, chart, summary, segments };
  });

  const span = () => view.to - view.from;
  const xOf = (e) => LEFT + ((e - view.from) / span()) * PLOT;
  const eventAt = (x) => Math.max(0, Math.min(events - 1, Math.floor(view.from + ((x - LEFT) / PLOT) * span())));
  // Bytes shown: bottomBytes to topBytes. Zoomed in, the bottom rises towards the least live
  // bytes in view, so that the allocations that come and go above the long-lived ones show.
  let topBytes = 1, bottomBytes = 0;
  const yOf = (b) => Math.min(TOP + HEIGHT, Math.max(TOP, TOP + HEIGHT - (HEIGHT * (b - bottomBytes)) / (topBytes - bottomBytes)));

  // The columns: one per pixel; each shows the state after its sample event, and the highest
  // live and reserved bytes of all the events it covers.
  function columns() {
    const list = [];
    const first = Math.max(0, Math.floor(view.from)), last = Math.min(events - 1, Math.ceil(view.to) - 1);
    for (let c = 0; c < PLOT; c++) {
      const x0 = view.from + (c * span()) / PLOT, x1 = view.from + ((c + 1) * span()) / PLOT;
      let a = Math.max(first, Math.floor(x0)), b = Math.min(last, Math.ceil(x1) - 1);
      if (b < a) b = a;
      if (a > last) break;
      list.push({ left: LEFT + c, right: LEFT + c + 1, a, b, sample: Math.min(last, Math.floor((x0 + x1) / 2)) });
    }
    return list;
  }

  function envelope(values, columnList) {
    return columnList.map((c) => {
      let highest = 0;
      for (let e = c.a; e <= c.b; e++) if (values[e] > highest) highest = values[e];
      return highest;
    });
  }

  // The allocations in colour: those covering the most bytes x events in view.
  function chooseDrawn() {
    const order = [];
    for (let i = 0; i < count; i++) {
      const visible = Math.min(died[i], view.to) - Math.max(born[i], view.from);
      if (visible > 0 || (born[i] >= view.from && born[i] < view.to)) order.push([size[i] * Math.max(visible, 1), i]);
    }
    order.sort((x, y) => y[0] - x[0]);
    return order.slice(0, DRAWN).map((pair) => pair[1]).sort((x, y) => x - y);
  }

  function drawChart(panel, columnList, drawn) {
    const { policy, chart } = panel;
    chart.textContent = "";
    chart.setAttribute("data-from", view.from);
    chart.setAttribute("data-to", view.to);
    chart.setAttribute("data-top-bytes", topBytes);
    chart.setAttribute("data-bottom-bytes", bottomBytes);
    // Axes: bytes.
    const yStep = niceBytesStep((topBytes - bottomBytes) / 5);
    for (let b = bottomBytes; b <= topBytes + 1e-9; b += yStep) {
      element("line", { x1: LEFT, x2: LEFT + PLOT, y1: yOf(b), y2: yOf(b), stroke: "#e4e4e4" }, chart);
      text(chart, LEFT - 6, yOf(b) + 4, bytes(b), { "text-anchor": "end", class: "y-tick" });
    }
    // Axes: events, and time under them where the trace has it.
    const xStep = Math.max(1, niceStep(span() / 7));
    for (let e = Math.ceil(view.from / xStep) * xStep; e <= view.to; e += xStep) {
      element("line", { x1: xOf(e), x2: xOf(e), y1: TOP + HEIGHT, y2: TOP + HEIGHT + 4, stroke: "#888" }, chart);
      text(chart, xOf(e), TOP + HEIGHT + 15, exact(e), { "text-anchor": "middle", class: "x-tick" });
      if (times) text(chart, xOf(e), TOP + HEIGHT + 28, duration(timeAt(e)), { "text-anchor": "middle", class: "time-tick" });
    }
    text(chart, LEFT + PLOT, TOP + HEIGHT + 40, times ? "events / time since the first" : "events (allocations and frees)",
      { "text-anchor": "end", class: "axis-title" });
    element("line", { x1: LEFT, x2: LEFT, y1: TOP, y2: TOP + HEIGHT, stroke: "#888" }, chart);
    element("line", { x1: LEFT, x2: LEFT + PLOT, y1: TOP + HEIGHT, y2: TOP + HEIGHT, stroke: "#888" }, chart);
    if (!columnList.length) return;
    // Grey: the highest live bytes in each column, so that no spike hides between samples.
    const live = envelope(policy.live, columnList);
    let points = LEFT + "," + yOf(0);
    columnList.forEach((c, k) => { points += " " + c.left + "," + yOf(live[k]) + " " + c.right + "," + yOf(live[k]); });
    points += " " + columnList[columnList.length - 1].right + "," + yOf(0);
    element("polygon", { points, fill: "#c8c8c8", class: "live-envelope" }, chart);
    // The drawn allocations, stacked in allocation order at each column's sample event.
    const tree = new Float64Array(count + 1); // a Fenwick tree of live bytes by allocation
    const add = (i, v) => { for (let k = i + 1; k <= count; k += k & -k) tree[k] += v; };
    const below = (i) => { let sum = 0; for (let k = i; k > 0; k -= k & -k) sum += tree[k]; return sum; };
    const isDrawn = new Map(drawn.map((i, d) => [i, d]));
    const bases = drawn.map(() => new Float64Array(columnList.length).fill(-1));
    const baseAtBirth = new Float64Array(drawn.length);
    let applied = 0;
    columnList.forEach((c, k) => {
      for (; applied <= c.sample; applied++) {
        const i = eventAllocation[applied];
        if (policy.segmentOf[i] < 0) continue;
        if (!eventFrees[applied] && isDrawn.has(i)) baseAtBirth[isDrawn.get(i)] = below(i);
        add(i, eventFrees[applied] ? -size[i] : size[i]);
      }
      drawn.forEach((i, d) => {
        if (policy.segmentOf[i] >= 0 && born[i] <= c.sample && c.sample < died[i]) bases[d][k] = below(i);
      });
    });
    drawn.forEach((i, d) => {
      if (policy.segmentOf[i] < 0) return;
      let top = "", bottom = "";
      columnList.forEach((c, k) => {
        const base = bases[d][k];
        if (base < 0) return;
        top += c.left + "," + yOf(base + size[i]) + " " + c.right + "," + yOf(base + size[i]) + " ";
        bottom = c.right + "," + yOf(base) + " " + c.left + "," + yOf(base) + " " + bottom;
      });
      const colour = "hsl(" + hue(i) + ",60%,60%)", edge = "hsl(" + hue(i) + ",60%,40%)";
      if (top) {
        element("polygon", { points: top + bottom, fill: colour, stroke: edge, "stroke-width": 0.3, "data-allocation": i }, chart);
      } else if (born[i] >= view.from && born[i] < view.to) { // shorter than a column: a sliver
        element("rect", { x: xOf(born[i]), width: 1.5, y: yOf(baseAtBirth[d] + size[i]),
          height: Math.max(1, yOf(baseAtBirth[d]) - yOf(baseAtBirth[d] + size[i])), fill: edge, "data-allocation": i }, chart);
      }
    });
    // Reserved: the highest in each column, as a step line.
    const reserved = envelope(policy.reserved, columnList);
    let line = "";
    columnList.forEach((c, k) => { line += c.left + "," + yOf(reserved[k]) + " " + c.right + "," + yOf(reserved[k]) + " "; });
    element("polyline", { points: line, fill: "none", stroke: "#c00", "stroke-width": 1.5, class: "reserved" }, chart);
    // Requests the policy refused (under a memory limit): a red mark each on the event axis.
    let marks = 0;
    for (let i = 0; i < count && marks < 2000; i++) {
      if (policy.segmentOf[i] >= 0 || born[i] < view.from || born[i] >= view.to) continue;
      const mark = element("line", { x1: xOf(born[i] + 0.5), x2: xOf(born[i] + 0.5), y1: TOP + HEIGHT - 8, y2: TOP + HEIGHT,
        stroke: "#e00", "stroke-width": 2, class: "refused", "data-refused": i }, chart);
      element("title", {}, mark).textContent = "refused: allocation " + (i + 1) + ", " + bytes(size[i]);
      marks++;
    }
    // The peak of reserved bytes, and the moment whose segments are shown.
    const peakAt = policy.figures.peak_reserved_at;
    if (peakAt >= view.from && peakAt < view.to) {
      element("circle", { cx: xOf(peakAt + 0.5), cy: yOf(policy.figures.peak_reserved), r: 3.5, fill: "#c00" }, chart);
      text(chart, Math.min(xOf(peakAt + 0.5) + 6, LEFT + PLOT - 150), Math.max(yOf(policy.figures.peak_reserved) - 5, TOP + 10),
        "peak reserved " + bytes(policy.figures.peak_reserved), { fill: "#c00" });
    }
    if (view.moment >= view.from && view.moment < view.to)
      element("line", { x1: xOf(view.moment + 0.5), x2: xOf(view.moment + 0.5), y1: TOP, y2: TOP + HEIGHT,
        stroke: "#06c", "stroke-width": 1.2, class: "moment" }, chart);
    panel.cursor = element("line", { x1: -10, x2: -10, y1: TOP, y2: TOP + HEIGHT, stroke: "#000", "stroke-dasharray": "3 3" }, chart);
    panel.selection = element("rect", { x: -10, width: 0, y: TOP, height: HEIGHT, fill: "rgba(0,100,200,0.15)" }, chart);
  }

  function render() {
    const columnList = columns();
    let highest = 1, lowest = Infinity;
    for (const panel of panels) {
      for (const values of [panel.policy.live, panel.policy.reserved])
        for (const v of envelope(values, columnList)) if (v > highest) highest = v;
      for (const c of columnList) lowest = Math.min(lowest, panel.policy.live[c.sample]);
    }
    const zoomed = view.from > 0 || view.to < events;
    const floor = zoomed && lowest < Infinity ? 0.9 * lowest : 0;
    const step = niceBytesStep(Math.max(highest - floor, 1) / 5);
    bottomBytes = Math.floor(floor / step) * step;
    topBytes = Math.max(Math.ceil(highest / step) * step, bottomBytes + step);
    const drawn = chooseDrawn();
    for (const panel of panels) {
      panel.columns = columnList;
      drawChart(panel, columnList, drawn);
    }
    const range = document.getElementById("range");
    range.setAttribute("data-from", view.from);
    range.setAttribute("data-to", view.to);
    range.textContent = "Events " + exact(view.from) + " to " + exact(view.to) + " of " + exact(events) +
      (times && events ? " (" + duration(timeAt(view.from)) + " to " + duration(timeAt(view.to - 1)) + ")" : "") +
      (view.from > 0 || view.to < events ? ": zoomed" : "");
    drawSegments();
  }

  // ---- what each segment held at the chosen moment -----------------------------------------
  function drawSegments() {
    const m = view.moment;
    let widest = 1;
    const layouts = panels.map((panel) => {
      const policy = panel.policy;
      const held = [];
      for (let s = 0; s < policy.segmentCount; s++)
        if (policy.segmentBorn[s] <= m && m < policy.segmentDied[s]) held.push({ s, blocks: [] });
      const where = new Map(held.map((h, k) => [h.s, k]));
      for (let i = 0; i < count; i++) {
        if (born[i] <= m && m < died[i] && where.has(policy.segmentOf[i])) held[where.get(policy.segmentOf[i])].blocks.push(i);
      }
      let reserved = 0;
      for (const h of held) {
        h.blocks.sort((x, y) => policy.offset[x] - policy.offset[y]);
        reserved += policy.segmentSize[h.s];
      }
      if (reserved > widest) widest = reserved;
      return { held, reserved };
    });
    const perRow = Math.max(1, Math.ceil(widest / ROWS)); // whole bytes: the rows add up exactly
    panels.forEach((panel, k) => {
      const { held, reserved } = layouts[k];
      const policy = panel.policy, svg = panel.segments;
      svg.textContent = "";
      let used = 0, freeBlocks = 0, largestFree = 0, at = 0;
      const piece = (start, length, attributes) => { // a run of bytes, wrapped over the rows
        let from = start;
        while (length > 0 && from < perRow * ROWS) {
          let row = Math.floor(from / perRow);
          if (from - row * perRow >= perRow) row++;
          const inRow = from - row * perRow, take = Math.min(length, perRow - inRow);
          if (!(take > 0)) break;
          element("rect", Object.assign({ x: 2 + (inRow / perRow) * (WIDTH - 4), y: 2 + row * (ROW + ROW_GAP),
            width: Math.max(0.4, (take / perRow) * (WIDTH - 4)), height: ROW }, attributes), svg);
          from += take;
          length -= take;
        }
      };
      for (const h of held) {
        let next = 0; // the first byte of the segment not yet drawn
        const gap = (end) => {
          if (end <= next) return;
          piece(at + next, end - next, { fill: "#ececec", "data-free": end - next, "data-segment": h.s });
          freeBlocks++;
          if (end - next > largestFree) largestFree = end - next;
        };
        for (const i of h.blocks) {
          gap(policy.offset[i]);
          piece(at + policy.offset[i], size[i], { fill: "hsl(" + hue(i) + ",60%,60%)", "data-allocation": i, "data-segment": h.s });
          used += size[i];
          next = Math.max(next, policy.offset[i] + size[i]);
        }
        gap(policy.segmentSize[h.s]);
        const row = Math.floor(at / perRow);
        element("line", { x1: 2 + ((at - row * perRow) / perRow) * (WIDTH - 4), x2: 2 + ((at - row * perRow) / perRow) * (WIDTH - 4),
          y1: 1 + row * (ROW + ROW_GAP), y2: 3 + row * (ROW + ROW_GAP) + ROW, stroke: "#222", "stroke-width": 1.2 }, svg);
        at += policy.segmentSize[h.s];
      }
      const summary = panel.summary;
      summary.setAttribute("data-event", m);
      summary.setAttribute("data-segments", held.length);
      summary.setAttribute("data-reserved", reserved);
      summary.setAttribute("data-used", used);
      summary.textContent = m < 0 ? "Click a moment to see its segments." :
        "After event " + exact(m) + (times ? " (" + duration(timeAt(m)) + ")" : "") + ": " + held.length +
        " segments, " + bytes(reserved) + " reserved, " + bytes(used) + " in use, " + bytes(reserved - used) +
        " free in " + freeBlocks + " blocks (largest " + bytes(largestFree) + ")";
    });
  }

  // ---- hovering, zooming, choosing a moment ------------------------------------------------
  const tip = document.getElementById("tip");
  function describe(i, policy) {
    const lifetime = died[i] - born[i];
    let words = "allocation " + (i + 1) + ": " + bytes(size[i]) + " (" + exact(size[i]) + " bytes)\n" +
      "from event " + exact(born[i]) + " to " + (died[i] >= events ? "the end, never freed" : exact(died[i])) +
      " (" + exact(lifetime) + " events" + (times ? ", " + duration(timeAt(Math.min(died[i], events - 1)) - timeAt(born[i])) : "") + ")";
    if (times) words += "\nallocated at " + duration(timeAt(born[i]));
    if (policy.segmentOf[i] >= 0)
      words += "\n" + policy.name + ": segment " + policy.segmentOf[i] + " at offset " + exact(policy.offset[i]);
    else words += "\n" + policy.name + ": refused";
    const stack = stacks.get(i);
    if (stack) words += "\nstack:\n  " + stack.join("\n  ");
    return words;
  }
  function show(words, event) {
    tip.textContent = words;
    tip.hidden = false;
    const x = event.clientX + 14, y = event.clientY + 14;
    tip.style.left = Math.min(x, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = Math.min(y, window.innerHeight - tip.offsetHeight - 4) + "px";
  }
  function hide() { tip.hidden = true; for (const p of panels) if (p.cursor) p.cursor.setAttribute("x1", -10), p.cursor.setAttribute("x2", -10); }

  // What is under the pointer in a chart: the allocation whose band holds those bytes at the
  // column's sample event, else the cached or unreserved bytes there.
  function hoverChart(panel, x, y, event) {
    const column = panel.columns[Math.floor(x - LEFT)];
    if (!column) return hide();
    const e = column.sample, policy = panel.policy;
    const wanted = bottomBytes + ((TOP + HEIGHT - y) / HEIGHT) * (topBytes - bottomBytes);
    for (const p of panels) p.cursor.setAttribute("x1", x), p.cursor.setAttribute("x2", x);
    let sum = 0;
    for (let i = 0; i < count && born[i] <= e; i++) {
      if (policy.segmentOf[i] < 0 || died[i] <= e) continue;
      if (wanted >= sum && wanted < sum + size[i]) return show(describe(i, policy), event);
      sum += size[i];
    }
    show("after event " + exact(e) + (times ? " (" + duration(timeAt(e)) + ")" : "") + "\nlive " + bytes(policy.live[e]) +
      " (" + exact(policy.live[e]) + " bytes)\nreserved " + bytes(policy.reserved[e]) + " (" + exact(policy.reserved[e]) +
      " bytes)\ncached, not in use: " + bytes(policy.reserved[e] - policy.live[e]), event);
  }

  function zoomTo(from, to) {
    const least = Math.min(events, 10);
    if (to - from < least) { const middle = (from + to) / 2; from = middle - least / 2; to = middle + least / 2; }
    view.from = Math.max(0, from);
    view.to = Math.min(Math.max(events, 1), to);
    render();
  }

  for (const panel of panels) {
    const chart = panel.chart;
    const local = (event) => {
      const box = chart.getBoundingClientRect();
      return [event.clientX - box.left, event.clientY - box.top];
    };
    const inPlot = ([x, y]) => x >= LEFT && x < LEFT + PLOT && y >= TOP && y <= TOP + HEIGHT;
    let dragFrom = null;
    chart.addEventListener("mousemove", (event) => {
      const point = local(event);
      if (dragFrom !== null) {
        const x0 = Math.min(dragFrom, point[0]), x1 = Math.max(dragFrom, point[0]);
        for (const p of panels) { p.selection.setAttribute("x", x0); p.selection.setAttribute("width", x1 - x0); }
      }
      if (inPlot(point)) hoverChart(panel, point[0], point[1], event);
      else hide();
    });
    chart.addEventListener("mouseleave", hide);
    chart.addEventListener("mousedown", (event) => {
      const point = local(event);
      if (inPlot(point)) { dragFrom = point[0]; event.preventDefault(); }
    });
    chart.addEventListener("mouseup", (event) => {
      if (dragFrom === null) return;
      const x = Math.max(LEFT, Math.min(LEFT + PLOT, local(event)[0]));
      const from = dragFrom;
      dragFrom = null;
      // A double click zooms out. Taken from the click count here: redrawing on the first
      // click replaces the elements under the pointer, so no dblclick event may follow.
      if (event.detail >= 2) return zoomTo(0, events);
      if (Math.abs(x - from) < 4) { // a click: this moment's segments
        const column = panel.columns[Math.floor(x - LEFT)];
        if (column) { view.moment = column.sample; render(); }
        return;
      }
      const e0 = view.from + ((Math.min(from, x) - LEFT) / PLOT) * span(), e1 = view.from + ((Math.max(from, x) - LEFT) / PLOT) * span();
      zoomTo(e0, e1);
    });
    chart.addEventListener("wheel", (event) => {
      const [x] = local(event);
      if (x < LEFT || x > LEFT + PLOT) return;
      event.preventDefault();
      const at = view.from + ((x - LEFT) / PLOT) * span(), factor = event.deltaY < 0 ? 0.8 : 1.25;
      zoomTo(at - (at - view.from) * factor, at + (view.to - at) * factor);
    }, { passive: false });
    panel.segments.addEventListener("mousemove", (event) => {
      const target = event.target;
      if (target.dataset && target.dataset.allocation !== undefined) show(describe(Number(target.dataset.allocation), panel.policy), event);
      else if (target.dataset && target.dataset.free !== undefined)
        show("free: " + bytes(Number(target.dataset.free)) + " (" + exact(Number(target.dataset.free)) + " bytes) in segment " + target.dataset.segment, event);
      else hide();
    });
    panel.segments.addEventListener("mouseleave", hide);
  }
  document.getElementById("whole").addEventListener("click", () => zoomTo(0, events));
  view.moment = events ? policies[0].figures.peak_reserved_at : -1;
  render();
  document.body.setAttribute("data-ready", "1");
})();

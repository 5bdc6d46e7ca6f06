// The aisched dashboard: polls /v1/dashboard and redraws. Plain DOM and inline SVG, nothing
// loaded from elsewhere. Text from the service (job names, reasons) only ever goes in as text.
"use strict";

const POLL_MS = 2000;
const MAX_SAMPLES = 1800;
const SVG = "http://www.w3.org/2000/svg";
let samples = [];
let lastSample = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    // Through the CSSOM: the page's Content-Security-Policy refuses inline style attributes.
    if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function num(v, digits = 1) {
  if (v === null || v === undefined) return "-";
  return Number.isInteger(v) ? String(v) : v.toFixed(digits);
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${(s / 3600).toFixed(1)}h`;
  return `${(s / 86400).toFixed(1)}d`;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

// The time of `t`, with its date (2026-12-09 22:34:31) when that is not the day of `now`.
function moment(t, now) {
  const d = new Date(t * 1000);
  if (d.toDateString() === new Date(now * 1000).toDateString()) return clock(t);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(t)}`;
}

// As the CLI says it (cli/eta.py): a passed ETA is "overdue", never a start in the past.
function etaWords(eta, now) {
  if (!eta) return "-";
  if (eta > now + 1) return `${moment(eta, now)} (in ${duration(eta - now)})`;
  if (eta >= now - 1) return "now";
  return `overdue by ${duration(now - eta)} (was ${moment(eta, now)})`;
}

function drawSummary(doc) {
  const s = doc.summary || {};
  const jobs = s.jobs || {};
  const box = document.getElementById("summary");
  const item = (label, value) => el("span", {}, `${label} `, el("b", {}, value));
  const pair = (p) => (p ? `${num(p.used)} / ${num(p.total)}` : "-");
  box.replaceChildren(
    item("running", jobs.running ?? 0),
    item("waiting", jobs.pending ?? 0),
    item("GPUs", pair(s.gpus)),
    item("CPUs", pair(s.cpus)),
    item("memory GiB", pair(s.mem_gib)),
    item("policy", doc.policy || "-"),
  );
}

function gpuLabel(gpu) {
  if (gpu.state === "free") return "free";
  return gpu.users
    .map((u) => `job ${u.job}${u.gpu_milli < 1000 ? ` ×${u.gpu_milli / 1000}` : ""}`)
    .join(", ");
}

function drawRacks(doc) {
  const racks = (doc.racks || []).map((rack) =>
    el(
      "div",
      { class: "rack", "data-rack": rack.name },
      el("div", { class: "title" }, `rack ${rack.name}`),
      ...rack.nodes.map((node) =>
        el(
          "div",
          { class: `node${node.healthy ? "" : " unhealthy"}`, "data-node": node.name },
          el(
            "div",
            { class: "title" },
            node.name + (node.healthy ? "" : " (unhealthy)"),
            el(
              "small",
              {},
              `CPUs ${num(node.free_cpus)} / ${num(node.cpus)} free · ` +
                `memory ${num(node.free_mem_gib)} / ${num(node.mem_gib)} GiB free`,
            ),
          ),
          node.gpus.length
            ? el(
                "div",
                { class: "gpus" },
                ...node.gpus.map((gpu) =>
                  el(
                    "div",
                    {
                      class: "gpu",
                      "data-node": node.name,
                      "data-gpu": gpu.index,
                      "data-state": gpu.state,
                      title: gpu.users.map((u) => `job ${u.job} ${u.name} (${u.queue}) ${u.task}`).join("\n")
                        || `${gpu.model}, free`,
                    },
                    el("div", { class: "idx" }, `GPU ${gpu.index}`),
                    el("div", { class: "jobs" }, gpuLabel(gpu)),
                    el("div", { class: "who" }, gpu.users.map((u) => u.name).filter(Boolean).join(", ")),
                  ),
                ),
              )
            : el("div", { class: "who" }, "no GPUs"),
        ),
      ),
    ),
  );
  document.getElementById("racks").replaceChildren(...racks);
}

function queueBar(q) {
  // One scale for every queue: the larger of its limit, guarantee and use, at least one GPU.
  const top = Math.max(q.limit_gpus ?? 0, q.guarantee_gpus, q.used_gpus, 1);
  const pct = (v) => `${(100 * v) / top}%`;
  // What is not borrowed is held within a guarantee: its own, or one above it.
  const within = Math.max(q.used_gpus - q.borrowed_gpus, 0);
  const bar = el("div", { class: "qbar" });
  bar.append(el("span", { class: "used", style: `left:0;width:${pct(within)}` }));
  if (q.borrowed_gpus > 0) {
    bar.append(el("span", { class: "borrowed", style: `left:${pct(within)};width:${pct(q.borrowed_gpus)}` }));
  }
  if (q.guarantee_gpus > 0) {
    bar.append(el("span", { class: "guarantee", style: `left:calc(${pct(q.guarantee_gpus)} - 1px)` }));
  }
  return bar;
}

// A per-user limit's resources, as the CLI's PER USER column names them.
const USER_UNITS = [["gpus", "GPU"], ["cpus", "CPU"], ["mem_gib", "GiB"]];

function userLimitText(limit) {
  if (!limit) return "-";
  return USER_UNITS.filter(([k]) => k in limit).map(([k, unit]) => `${num(limit[k])} ${unit}`).join(", ");
}

function userBar(u, limit) {
  // The user's share of the limit on its tightest resource; full at the limit. A limit of 0
  // bans the resource (such jobs are refused at submission): no share of it is held.
  const share = Math.min(Math.max(...USER_UNITS.filter(([k]) => k in limit).map(([k]) => (limit[k] > 0 ? u[k] / limit[k] : 0)), 0), 1);
  const bar = el("div", { class: "qbar" });
  bar.append(el("span", { class: u.at_limit ? "borrowed" : "used", style: `left:0;width:${100 * share}%` }));
  return bar;
}

// Under a queue with a per-user limit: one row per user with running jobs there.
function userRows(q) {
  return (q.users || []).map((u) =>
    el(
      "tr",
      { class: u.at_limit ? "queue-user at-limit" : "queue-user", "data-in-queue": q.name, "data-user": u.user },
      el("td", { class: "user" }, u.others ? "other users" : u.user),
      el("td", {}, u.others ? null : userBar(u, q.user_limit)),
      el(
        "td",
        { class: "held", colspan: 8 },
        USER_UNITS.filter(([k]) => k in q.user_limit)
          .map(([k, unit]) => `${num(u[k], 2)} of ${num(q.user_limit[k])} ${unit}`)
          .join(", ") + (u.at_limit ? " (at the limit: their next job here waits)" : ""),
      ),
    ),
  );
}

function drawQueues(doc) {
  const head = el(
    "tr",
    {},
    ...["queue", "GPUs", "used", "guarantee", "borrowed", "share", "waiting", "running", "max priority", "per user"].map((h) => el("th", {}, h)),
  );
  const rows = (doc.queues || []).flatMap((q) => [
    el(
      "tr",
      { "data-queue": q.name },
      el("td", {}, q.parent ? `${q.parent} / ${q.name}` : q.name),
      el("td", {}, queueBar(q)),
      el("td", { class: "num" }, num(q.used_gpus, 2)),
      el("td", { class: "num" }, num(q.guarantee_gpus, 2) + (q.limit_gpus !== null ? ` (limit ${num(q.limit_gpus)})` : "")),
      el("td", { class: "num" }, num(q.borrowed_gpus, 2)),
      el("td", { class: "num" }, `${(100 * q.share).toFixed(0)}%`),
      el("td", { class: "num" }, q.pending),
      el("td", { class: "num" }, q.running),
      el("td", { class: "num max-priority" }, q.max_priority),
      el("td", { class: "user-limit" }, userLimitText(q.user_limit)),
    ),
    ...userRows(q),
  ]);
  document.getElementById("queues").replaceChildren(head, ...rows);
}

function drawPending(doc) {
  const head = el("tr", {}, ...["job", "queue", "GPUs", "waiting", "reason", "estimated start"].map((h) => el("th", {}, h)));
  const rows = (doc.pending || []).map((j) =>
    el(
      "tr",
      { "data-job": j.id },
      el("td", {}, `${j.id} ${j.name}`),
      el("td", {}, j.queue),
      el("td", { class: "num" }, num(j.gpus, 2)),
      el("td", { class: "num" }, duration(j.waited_s)),
      el("td", { class: "reason" }, j.reason),
      el("td", {}, etaWords(j.eta, doc.time)),
    ),
  );
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6, class: "empty" }, "no job is waiting")));
  if (doc.pending_more > 0) {
    rows.push(el("tr", { class: "more" }, el("td", { colspan: 6, class: "empty" }, `and ${doc.pending_more} more waiting jobs, submitted later`)));
  }
  document.getElementById("pending").replaceChildren(head, ...rows);
}

function drawTimeline(doc) {
  const jobs = doc.timeline || [];
  const box = document.getElementById("timeline");
  if (!jobs.length) {
    box.replaceChildren(el("div", { class: "who" }, "no jobs yet"));
    return;
  }
  const now = doc.time;
  const t0 = Math.min(...jobs.map((j) => j.submitted_at));
  const span = Math.max(now - t0, 1);
  const W = 1000, left = 190, right = 10, rowH = 16, top = 4;
  const H = top + rowH * jobs.length + 22;
  const x = (t) => left + ((W - left - right) * (t - t0)) / span;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "recent jobs over time" });
  jobs.forEach((j, i) => {
    const y = top + i * rowH;
    const g = svgEl("g", { "data-job": j.id });
    const label = `${j.id} ${j.name}`.slice(0, 28);
    g.append(svgEl("text", { x: 4, y: y + 11 }, label));
    // Each attempt's run, and grey while it waits: before the first, between them (preempted
    // and requeued), and after the last while it waits again.
    const runs = j.runs?.length ? j.runs : j.started_at !== null ? [[j.started_at, j.finished_at]] : [];
    const waits = [];
    let waitFrom = j.submitted_at;
    for (const [from, to] of runs) {
      waits.push([waitFrom, from]);
      waitFrom = to ?? now;
    }
    if (!runs.length) waits.push([j.submitted_at, j.finished_at ?? now]);
    else if (j.state === "pending") waits.push([waitFrom, now]);
    waits.forEach(([from, to], k) => {
      if (k > 0 && to <= from) return;
      g.append(svgEl("rect", { class: "bar-wait", x: x(from), y: y + 3, width: Math.max(x(to) - x(from), 1), height: rowH - 6 }));
    });
    runs.forEach(([from, to], k) => {
      const end = to ?? now;
      // A run before the last, or the last of a job waiting again, ran and was stopped.
      const state = k === runs.length - 1 && j.state !== "pending" ? j.state : "running";
      const bar = svgEl("rect", { class: `bar-${state}`, x: x(from), y: y + 1, width: Math.max(x(end) - x(from), 2), height: rowH - 2 });
      bar.append(svgEl("title", {}, `job ${j.id} ${j.name}: ${j.state}, ${num(j.gpus)} GPUs, ran ${duration(end - from)}`));
      g.append(bar);
    });
    svg.append(g);
  });
  const axisY = top + rowH * jobs.length + 2;
  svg.append(svgEl("line", { class: "axis", x1: left, x2: W - right, y1: axisY, y2: axisY }));
  svg.append(svgEl("text", { x: left, y: axisY + 14 }, clock(t0)));
  svg.append(svgEl("text", { x: W - right, y: axisY + 14, "text-anchor": "end" }, `${clock(now)} (now)`));
  svg.append(svgEl("text", { x: (left + W) / 2, y: axisY + 14, "text-anchor": "middle" }, "grey: waiting · blue: running · green: succeeded · red: failed"));
  box.replaceChildren(svg);
}

function drawUtilisation() {
  const box = document.getElementById("utilisation");
  if (samples.length < 1) {
    box.replaceChildren(el("div", { class: "who" }, "no samples yet"));
    return;
  }
  const W = 1000, H = 180, left = 40, right = 10, top = 8, bottom = 22;
  const t0 = samples[0].time, t1 = Math.max(samples[samples.length - 1].time, t0 + 1);
  const x = (t) => left + ((W - left - right) * (t - t0)) / (t1 - t0);
  const y = (f) => top + (H - top - bottom) * (1 - Math.min(Math.max(f, 0), 1));
  const frac = (used, total) => (total > 0 ? used / total : 0);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "utilisation over time" });
  for (const f of [0, 0.5, 1]) {
    svg.append(svgEl("line", { class: "axis", x1: left, x2: W - right, y1: y(f), y2: y(f) }));
    svg.append(svgEl("text", { x: left - 4, y: y(f) + 4, "text-anchor": "end" }, `${f * 100}%`));
  }
  const line = (cls, pick) => {
    // A step line: each sample holds until the next one.
    const pts = samples
      .map((s, i) => {
        const here = `${x(s.time).toFixed(1)},${y(pick(s)).toFixed(1)}`;
        return i ? `${x(s.time).toFixed(1)},${y(pick(samples[i - 1])).toFixed(1)} ${here}` : here;
      })
      .join(" ");
    svg.append(svgEl("polyline", { class: cls, points: samples.length > 1 ? pts : `${left},${y(pick(samples[0]))} ${W - right},${y(pick(samples[0]))}` }));
  };
  line("line-mem", (s) => frac(s.mem_used_bytes, s.mem_total_bytes));
  line("line-cpu", (s) => frac(s.cpus_used, s.cpus_total));
  line("line-gpu", (s) => frac(s.gpus_used, s.gpus_total));
  svg.append(svgEl("text", { x: left, y: H - 6 }, clock(t0)));
  svg.append(svgEl("text", { x: W - right, y: H - 6, "text-anchor": "end" }, clock(t1)));
  svg.append(svgEl("text", { x: (left + W) / 2, y: H - 6, "text-anchor": "middle" }, "blue: GPUs · orange: CPUs · purple: memory (allocated share)"));
  box.replaceChildren(svg);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const url = lastSample === null ? "v1/dashboard" : `v1/dashboard?since=${lastSample}`;
    const r = await fetch(url, { cache: "no-store" });
    if (r.status === 401) {
      // Signed out (the token revoked or expired): the page itself answers with the login form.
      location.reload();
      return;
    }
    if (!r.ok) throw new Error(`the service answered ${r.status}`);
    const doc = await r.json();
    samples = samples.concat(doc.utilisation || []).slice(-MAX_SAMPLES);
    if (samples.length) lastSample = samples[samples.length - 1].time;
    drawSummary(doc);
    drawRacks(doc);
    drawQueues(doc);
    drawPending(doc);
    drawTimeline(doc);
    drawUtilisation();
    const problems = (doc.errors || []).length ? ` · ${doc.errors.length} section(s) failed: ${doc.errors.join("; ")}` : "";
    status.textContent = `aisched ${doc.version} · updated ${clock(doc.time)}${problems}`;
    status.className = problems ? "status error" : "status";
    document.body.dataset.loaded = "true";
  } catch (e) {
    status.textContent = `cannot reach the service: ${e.message}`;
    status.className = "status error";
  }
  setTimeout(poll, POLL_MS);
}

poll();

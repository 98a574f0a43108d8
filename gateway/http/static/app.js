// tsgate's built-in page: explore series, run a query and draw it, see the gateway's status.
// Vanilla JavaScript, no build step, nothing loaded from elsewhere. Every piece of data (metric
// names, label values, tenants, errors) reaches the page as text nodes or attribute values set
// with textContent/setAttribute, never as HTML: a label value holding markup shows as text.
"use strict";

const SERIES_LIMIT = 500; // rows of the series table and entries of the pick lists
const STATUS_REFRESH_MS = 5000;
const POINTS_WANTED = 250; // a range query's step is the range over this
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const SVG = "http://www.w3.org/2000/svg";

const state = { tenant: null, session: null, view: null, statusTimer: null, previousStatus: null, exploreLoad: 0 };

const $ = (id) => document.getElementById(id);

// An element with attributes and children (strings become text nodes).
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function svg(tag, attributes = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function showError(error) {
  const message = $("message");
  message.textContent = error ? String(error.message || error) : "";
  message.hidden = !error;
}

// GET a JSON API of the gateway with the browser's credential and the picked tenant.
async function api(path, params = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(params)) {
    for (const item of Array.isArray(value) ? value : [value]) url.searchParams.append(name, item);
  }
  const headers = { Accept: "application/json" };
  if (state.tenant) headers["X-Scope-OrgID"] = state.tenant;
  const answer = await fetch(url, { headers, credentials: "same-origin" });
  const text = await answer.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch (_) {
    body = null;
  }
  if (!answer.ok) {
    const reason = body && body.error ? body.error : text.slice(0, 200);
    const error = new Error(`${path}: ${answer.status} ${reason}`);
    error.status = answer.status;
    throw error;
  }
  return body;
}

function clear(node) {
  while (node.firstChild) node.firstChild.remove();
}

function row(cells) {
  const isCell = (cell) => cell instanceof Node && (cell.tagName === "TD" || cell.tagName === "TH");
  return el("tr", {}, ...cells.map((cell) => (isCell(cell) ? cell : el("td", {}, cell))));
}

function numberCell(value) {
  return el("td", { class: "number" }, value);
}

// A label value as a PromQL string, with \ " and newlines escaped.
function quoted(value) {
  return `"${value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`;
}

// A metric name or label name as PromQL reads it: as it is when it is a classic identifier, else
// quoted, as Prometheus 3 writes UTF-8 names ({"http.server.request.duration", "k8s.pod.name"="p-1"}).
function promqlName(name, metric) {
  return (metric ? /^[a-zA-Z_:][a-zA-Z0-9_:]*$/ : /^[a-zA-Z_][a-zA-Z0-9_]*$/).test(name) ? name : quoted(name);
}

// Prometheus's text form of a series: name{label="value", ...} with \ " and newlines escaped;
// a name outside the classic identifiers is quoted inside the braces, as Prometheus 3 writes it.
function seriesText(labels) {
  const name = labels.__name__ || "";
  const pairs = Object.keys(labels)
    .filter((key) => key !== "__name__")
    .sort()
    .map((key) => `${promqlName(key, false)}=${quoted(labels[key])}`);
  if (name && promqlName(name, true) !== name) return `{${[quoted(name), ...pairs].join(", ")}}`;
  return pairs.length ? `${name}{${pairs.join(", ")}}` : name || "{}";
}

function formatNumber(value) {
  if (!Number.isFinite(value)) return String(value);
  const size = Math.abs(value);
  if (size !== 0 && (size >= 1e9 || size < 1e-3)) return value.toExponential(3);
  return String(parseFloat(value.toPrecision(6)));
}

function formatDuration(seconds) {
  const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  const parts = [];
  let left = Math.floor(seconds);
  for (const [unit, size] of units) {
    if (left >= size || (unit === "s" && !parts.length)) {
      parts.push(`${Math.floor(left / size)}${unit}`);
      left %= size;
    }
  }
  return parts.slice(0, 2).join(" ");
}

// -- views ------------------------------------------------------------------------------------

function showView(view) {
  state.view = view;
  for (const name of ["explore", "query", "status"]) {
    $(`view-${name}`).hidden = name !== view;
    $(`tab-${name}`).classList.toggle("active", name === view);
  }
  clearInterval(state.statusTimer);
  state.statusTimer = null;
  showError(null);
  if (view === "explore") loadExplore().catch(showError);
  if (view === "status") {
    state.previousStatus = null;
    loadStatus().catch(showError);
    loadCardinality().catch(showError);
    state.statusTimer = setInterval(() => loadStatus().catch(showError), STATUS_REFRESH_MS);
  }
  if (window.location.hash !== `#${view}`) history.replaceState(null, "", `#${view}`);
}

// -- explore ----------------------------------------------------------------------------------

let metricNames = [];

// The lists of the explore view, emptied at once and filled when the answers come; an answer
// that a later load (another tenant, the tab clicked again) overtook is dropped.
async function loadExplore() {
  const load = ++state.exploreLoad;
  for (const id of ["metric-list", "label-list", "graphite-tree", "label-values"]) clear($(id));
  const [names, labels, nodes] = await Promise.all([
    api("/api/metadata/metricNames"),
    api("/api/v1/labels"),
    api("/metrics/find", { query: "*" }),
  ]);
  if (load !== state.exploreLoad) return;
  metricNames = names;
  renderMetricList();
  const list = $("label-list");
  clear(list);
  for (const label of labels.data.filter((name) => name !== "__name__").slice(0, SERIES_LIMIT)) {
    const item = el("li", { "data-label": label }, label);
    item.addEventListener("click", () => showLabelValues(label).catch(showError));
    list.append(item);
  }
  showGraphiteNodes($("graphite-tree"), nodes);
}

function renderMetricList() {
  const filter = $("metric-filter").value.toLowerCase();
  const list = $("metric-list");
  clear(list);
  for (const name of metricNames.filter((n) => n.toLowerCase().includes(filter)).slice(0, SERIES_LIMIT)) {
    const item = el("li", { "data-metric": name }, name);
    item.addEventListener("click", () => showMetric(name).catch(showError));
    list.append(item);
  }
}

function matcher(label, value) {
  return `{${promqlName(label, false)}=${quoted(value)}}`;
}

// A metric of the list (its name as written, dots and all, as the Prometheus API shows it too):
// its series through the Prometheus API.
function showMetric(metric) {
  for (const item of $("metric-list").children) item.classList.toggle("selected", item.dataset.metric === metric);
  for (const item of $("label-list").children) item.classList.remove("selected");
  clear($("label-values"));
  return showSeries(matcher("__name__", metric), metric, seriesText({ __name__: metric }));
}

// The series ``selector`` matches as a table of their labels (the metric name too when they differ).
async function showSeries(selector, title, expression) {
  const answer = await api("/api/v1/series", { "match[]": selector, limit: SERIES_LIMIT });
  $("explore-title").textContent = `${title}: ${answer.data.length} series`;
  const button = $("explore-query");
  button.hidden = false;
  button.onclick = () => {
    $("query-kind").value = "promql";
    $("query-expr").value = expression;
    showView("query");
    runQuery().catch(showError);
  };
  const names = new Set(answer.data.map((labels) => labels.__name__));
  const labelNames = [...new Set(answer.data.flatMap((labels) => Object.keys(labels)))].filter((k) => k !== "__name__");
  const keys = names.size > 1 ? ["__name__", ...labelNames.sort()] : labelNames.sort();
  const table = $("series-table");
  const head = table.tHead;
  clear(head);
  head.append(row(keys.map((key) => el("th", {}, key))));
  const body = table.tBodies[0];
  clear(body);
  for (const labels of answer.data) body.append(row(keys.map((key) => labels[key] ?? "")));
}

async function showLabelValues(label) {
  for (const item of $("label-list").children) item.classList.toggle("selected", item.dataset.label === label);
  const answer = await api(`/api/v1/label/${encodeURIComponent(label)}/values`, { limit: SERIES_LIMIT });
  $("explore-title").textContent = `label ${label}: ${answer.data.length} values`;
  $("explore-query").hidden = true;
  clear($("series-table").tHead);
  clear($("series-table").tBodies[0]);
  const list = $("label-values");
  clear(list);
  for (const value of answer.data) {
    const item = el("li", { "data-value": value }, value);
    item.addEventListener("click", () => {
      for (const other of list.children) other.classList.toggle("selected", other === item);
      showSeries(matcher(label, value), `${label}=${quoted(value)}`, matcher(label, value)).catch(showError);
    });
    list.append(item);
  }
}

// One level of the Graphite tree (the answer of /metrics/find) into ``list``; a branch opens
// its own level when clicked.
function showGraphiteNodes(list, nodes) {
  for (const node of nodes.slice(0, SERIES_LIMIT)) {
    const item = el("li", { "data-path": node.id, class: node.leaf ? "leaf" : "branch" }, node.leaf ? node.text : `${node.text}/`);
    if (node.leaf) {
      item.addEventListener("click", (event) => {
        event.stopPropagation();
        $("query-kind").value = "graphite";
        $("query-expr").value = node.id;
        showView("query");
        runQuery().catch(showError);
      });
    } else {
      item.addEventListener("click", (event) => {
        event.stopPropagation();
        const open = item.querySelector("ul");
        if (open) {
          open.remove();
          return;
        }
        const children = el("ul", { class: "tree" });
        item.append(children);
        api("/metrics/find", { query: `${node.id}.*` })
          .then((found) => showGraphiteNodes(children, found))
          .catch(showError);
      });
    }
    list.append(item);
  }
}

// -- query ------------------------------------------------------------------------------------

function queryWindow() {
  const rangeS = Number($("query-range").value);
  const endText = $("query-end").value;
  const endS = Math.floor((endText ? new Date(endText).getTime() : Date.now()) / 1000);
  return { startS: endS - rangeS, endS, stepS: Math.max(1, Math.round(rangeS / POINTS_WANTED)) };
}

// The answer of a query as [{name, points: [[seconds, number]], last: [seconds, text]}].
async function fetchSeries(kind, expression, window_) {
  if (kind === "graphite") {
    const answer = await api("/render", {
      target: expression,
      from: window_.startS,
      until: window_.endS,
      format: "json",
      maxDataPoints: POINTS_WANTED * 4,
    });
    return answer.map((series) => {
      const points = series.datapoints.filter(([value]) => value !== null).map(([value, t]) => [t, value]);
      const last = points.length ? [points[points.length - 1][0], String(points[points.length - 1][1])] : null;
      return { name: series.target, points, last };
    });
  }
  const answer = await api("/api/v1/query_range", {
    query: expression,
    start: window_.startS,
    end: window_.endS,
    step: window_.stepS,
  });
  const result = answer.data.resultType === "matrix" ? answer.data.result : [];
  return result.map((series) => ({
    name: seriesText(series.metric),
    points: series.values.map(([t, value]) => [t, Number(value)]),
    last: series.values.length ? series.values[series.values.length - 1] : null,
  }));
}

async function runQuery() {
  const expression = $("query-expr").value.trim();
  if (!expression) return;
  showError(null);
  const kind = $("query-kind").value;
  const window_ = queryWindow();
  $("query-info").textContent = "running…";
  const started = performance.now();
  let series;
  try {
    series = await fetchSeries(kind, expression, window_);
  } catch (error) {
    $("query-info").textContent = "";
    for (const id of ["query-graph", "query-legend"]) clear($(id));
    clear($("query-table").tBodies[0]);
    throw error;
  }
  const points = series.reduce((sum, s) => sum + s.points.length, 0);
  $("query-info").textContent = `${series.length} series, ${points} points, ${Math.round(performance.now() - started)} ms`;
  drawChart($("query-graph"), series, window_);
  renderLegend(series);
  renderQueryTable(series);
}

function renderQueryTable(series) {
  const body = $("query-table").tBodies[0];
  clear(body);
  for (const s of series) {
    const at = s.last ? new Date(s.last[0] * 1000).toISOString() : "";
    const last = numberCell(s.last ? formatNumber(Number(s.last[1])) : "");
    if (s.last) last.title = s.last[1];
    body.append(row([el("td", { class: "series-name" }, s.name), numberCell(s.points.length), last, at]));
  }
}

function renderLegend(series) {
  const legend = $("query-legend");
  clear(legend);
  series.forEach((s, index) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = COLORS[index % COLORS.length];
    legend.append(el("li", {}, swatch, s.name));
  });
}

// A step of about span/count rounded to 1, 2 or 5 times a power of ten.
function niceStep(span, count) {
  const raw = span / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const normal = raw / magnitude;
  return (normal < 1.5 ? 1 : normal < 3 ? 2 : normal < 7 ? 5 : 10) * magnitude;
}

// Tick steps of the time axis (seconds): a tick falls on a whole multiple, in local time.
const TIME_STEPS = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 2592000];

// The ticks of [startS, endS]: about ``count`` of them, on round local times.
function timeTicks(startS, endS, count) {
  const step = TIME_STEPS.find((candidate) => (endS - startS) / candidate <= count) ?? TIME_STEPS[TIME_STEPS.length - 1];
  const offsetS = new Date(startS * 1000).getTimezoneOffset() * 60;
  const ticks = [];
  for (let t = Math.ceil((startS - offsetS) / step) * step + offsetS; t <= endS; t += step) ticks.push(t);
  return ticks;
}

function timeLabel(seconds, spanS) {
  const date = new Date(seconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  const clock = `${pad(date.getHours())}:${pad(date.getMinutes())}`;
  return spanS > 2 * 86400 ? `${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${clock}` : clock;
}

// An SVG line chart of ``series`` over the query window: one path per series (gaps where
// points are missing), a dot for a point with no neighbour, grid lines and axis labels.
function drawChart(container, series, window_) {
  clear(container);
  const width = 1000, height = 340, left = 70, right = 15, top = 10, bottom = 28;
  const values = series.flatMap((s) => s.points.map(([, v]) => v)).filter(Number.isFinite);
  const chart = svg("svg", { id: "query-chart", viewBox: `0 0 ${width} ${height}`, role: "img" });
  container.append(chart);
  if (!values.length) {
    chart.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle" }, "no data points"));
    return;
  }
  let low = Math.min(...values), high = Math.max(...values);
  if (low === high) {
    const pad = Math.abs(low) * 0.1 || 1;
    low -= pad;
    high += pad;
  }
  const step = niceStep(high - low, 5);
  low = Math.floor(low / step) * step;
  high = Math.ceil(high / step) * step;
  const spanS = window_.endS - window_.startS;
  const x = (t) => left + ((t - window_.startS) / spanS) * (width - left - right);
  const y = (v) => top + (1 - (v - low) / (high - low)) * (height - top - bottom);
  const axis = svg("g", { class: "axis" });
  chart.append(axis);
  for (let v = low; v <= high + step / 2; v += step) {
    axis.append(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    axis.append(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, formatNumber(v)));
  }
  for (const t of timeTicks(window_.startS, window_.endS, 7)) {
    axis.append(svg("line", { class: "grid", x1: x(t), x2: x(t), y1: top, y2: height - bottom }));
    axis.append(svg("text", { x: x(t), y: height - 8, "text-anchor": "middle" }, timeLabel(t, spanS)));
  }
  series.forEach((s, index) => {
    const color = COLORS[index % COLORS.length];
    const gapS = Math.max(window_.stepS * 2, 1);
    const segments = [];
    let previous = null;
    for (const [t, v] of s.points) {
      if (!Number.isFinite(v)) {
        previous = null;
        continue;
      }
      if (previous === null || t - previous > gapS) segments.push([]);
      segments[segments.length - 1].push([t, v]);
      previous = t;
    }
    const group = svg("g", { class: "series", "data-series": s.name });
    const drawn = segments.filter((segment) => segment.length > 1);
    if (drawn.length) {
      const path = drawn.map((segment) => segment.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("")).join("");
      group.append(svg("path", { class: "series-line", d: path, fill: "none", stroke: color, "stroke-width": 1.5 }));
    }
    for (const segment of segments.filter((segment) => segment.length === 1)) {
      const [[t, v]] = segment;
      group.append(svg("circle", { class: "series-point", cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, fill: color }));
    }
    group.setAttribute("data-points", segments.reduce((sum, segment) => sum + segment.length, 0));
    chart.append(group);
  });
}

// -- status -----------------------------------------------------------------------------------

async function loadStatus() {
  let status;
  try {
    status = await api("/admin/status");
  } catch (error) {
    if (error.status === 403) throw new Error("the status view needs a credential with the admin role");
    throw error;
  }
  const now = performance.now();
  const previous = state.previousStatus;
  const rate = (current, before) =>
    previous && before !== undefined ? formatNumber(Math.max(0, current - before) / ((now - previous.at) / 1000)) : "…";
  renderStatusSummary(status);
  const tenantsBefore = previous ? Object.fromEntries(previous.status.tenants.map((t) => [t.tenant, t.samples_accepted])) : {};
  const tenants = $("status-tenants").tBodies[0];
  clear(tenants);
  for (const t of status.tenants) {
    tenants.append(row([t.tenant, numberCell(t.active_series), numberCell(t.samples_accepted), numberCell(rate(t.samples_accepted, tenantsBefore[t.tenant] ?? 0))]));
  }
  const ingest = $("status-ingest").tBodies[0];
  clear(ingest);
  for (const [protocol, count] of Object.entries(status.samples_accepted)) {
    const before = previous ? previous.status.samples_accepted[protocol] ?? 0 : undefined;
    ingest.append(row([protocol, numberCell(count), numberCell(rate(count, before))]));
  }
  const rejects = $("status-rejects").tBodies[0];
  clear(rejects);
  for (const reject of status.samples_rejected) rejects.append(row([reject.protocol, reject.reason, numberCell(reject.count)]));
  const downsample = status.downsample;
  keyValues($("status-downsample"), [
    ["Lag", formatDuration(downsample.lag_seconds)],
    ["Settled slots waiting", downsample.settled_slots],
    ["Slots near expiry", downsample.slots_near_expiry],
    ["Failed rounds (partition-slots)", downsample.errors],
    ["Series-slots rolled up", downsample.series_slots_rolled_up],
    ["Pending marks", downsample.pending_marks],
  ]);
  const errors = $("status-errors").tBodies[0];
  clear(errors);
  for (const [operation, count] of Object.entries(status.store_errors)) errors.append(row(["store", operation, numberCell(count)]));
  for (const [operation, count] of Object.entries(status.redis.errors)) errors.append(row(["redis", operation, numberCell(count)]));
  state.previousStatus = { status, at: now };
}

// The picked tenant's cardinality (/api/v1/status/tsdb, the last 24 hours): which metric and which
// label blew up. Loaded when the view opens, not at every refresh: it reads the time index.
async function loadCardinality() {
  const stats = await api("/api/v1/status/tsdb", { limit: 10 });
  const data = stats.data;
  const warnings = stats.warnings ? ` (${stats.warnings.join("; ")})` : "";
  $("status-cardinality-summary").textContent =
    `${formatNumber(data.headStats.numSeries)} series, ${formatNumber(data.headStats.numLabelPairs)} label pairs${warnings}`;
  for (const [id, list] of [
    ["status-card-metrics", data.seriesCountByMetricName],
    ["status-card-labels", data.labelValueCountByLabelName],
    ["status-card-pairs", data.seriesCountByLabelValuePair],
  ]) {
    const body = $(id).tBodies[0];
    clear(body);
    for (const entry of list) body.append(row([entry.name, numberCell(formatNumber(entry.value))]));
  }
}

function renderStatusSummary(status) {
  const store = status.store.healthy ? `${status.store.kind}: healthy` : `${status.store.kind}: FAILING (${status.store.error})`;
  keyValues($("status-summary"), [
    ["Version", status.version],
    ["Uptime", formatDuration(status.uptime_seconds)],
    ["Store", store],
    ["Redis", !status.redis.configured ? "not configured" : status.redis.healthy ? "healthy" : `FAILING (${status.redis.error})`],
    ["Roles", status.roles.join(", ")],
    ["Samples in flight", status.ingest_inflight_samples],
    ["Open connections", status.open_connections],
  ]);
}

function keyValues(table, pairs) {
  const body = table.tBodies[0];
  clear(body);
  for (const [key, value] of pairs) body.append(el("tr", {}, el("th", {}, key), el("td", {}, value)));
}

// -- start ------------------------------------------------------------------------------------

const TENANT_KEY = "tsgate.tenant";

// The tenant the page opens on: ?tenant=, else the one picked last, else the first named tenant
// (``default`` holds what came without one: a named tenant is likelier what the user is after).
function firstTenant(tenants) {
  const wanted = [new URLSearchParams(window.location.search).get("tenant"), window.localStorage.getItem(TENANT_KEY)];
  return wanted.find((tenant) => tenant && tenants.includes(tenant)) ?? tenants.find((t) => t !== "default") ?? tenants[0];
}

async function start() {
  for (const name of ["explore", "query", "status"]) $(`tab-${name}`).addEventListener("click", () => showView(name));
  $("metric-filter").addEventListener("input", renderMetricList);
  $("query-form").addEventListener("submit", (event) => {
    event.preventDefault();
    runQuery().catch(showError);
  });
  const session = await api("/ui/session");
  state.session = session;
  $("who").textContent = session.auth ? `${session.user} (${session.roles.join(", ")})` : "";
  const select = $("tenant");
  for (const tenant of session.tenants) select.append(el("option", { value: tenant }, tenant));
  select.value = firstTenant(session.tenants);
  state.tenant = select.value;
  select.addEventListener("change", () => {
    state.tenant = select.value;
    window.localStorage.setItem(TENANT_KEY, select.value);
    showView(state.view);
  });
  const view = window.location.hash.slice(1);
  showView(["explore", "query", "status"].includes(view) ? view : "explore");
}

document.addEventListener("DOMContentLoaded", () => start().catch(showError));

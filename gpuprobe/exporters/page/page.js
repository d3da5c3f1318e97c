/* gpuprobe's live page: polls /metrics once a second and draws what the Grafana overview shows.

   Rates and quantiles are computed here from the counters and histogram buckets of two scrapes: the
   newest, and the oldest within the chosen window (Prometheus' rate() and histogram_quantile() over that
   window, without extrapolation; a series missing from the older scrape counts from 0, as it was created
   by its first observation). "Whole run" reads the newest scrape alone: everything since the process
   started. Every number shown is also in the DOM (data-value, in seconds, bytes or per second), and the
   scrapes it came from are named on <body> (data-scrape, data-base: their numbers, 1 for the page's
   first successful scrape; data-seconds: the time between them).

   When it opens, the page reads its history (/gpuprobe/history: the server's scrapes of the charted series
   every few seconds, for the last minutes) and draws it before its own scrapes, through the same code: the
   charts of a page opened after the requests ran still show them (<body data-history>: scrapes drawn so).
   Its own windows, tiles and tables are its own scrapes' alone. The requests table reads /requests (the
   requests running now and the most recent finished ones) at each poll; every text from it is set as text,
   never as HTML. */
"use strict";
(() => {
  const POLL_MS = 1000;
  const KEEP_POINTS = 900;       // chart points kept: 15 minutes at one a second
  const MAX_WINDOW_S = 300;      // the longest window offered; raw scrapes are kept this long
  const FINISHED_SHOWN = 100;    // finished requests listed at most (/requests sends no more)
  const REQUESTS_PATH = "/requests";
  const HISTORY_PATH = "/gpuprobe/history";
  // Prometheus' own preference: the page then shares the body a Prometheus scrape caused (one rendering).
  const ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
  const COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a",
                  "#37872d", "#c4162a", "#1f60c4", "#8f3bb8"];
  const TEXT = "#9fa3ad";
  const GRID = "#262a31";

  // ---------------------------------------------------------------- parsing the exposition
  const ids = new Map();     // series key (name{labels} as written) -> index
  const meta = [];           // index -> {name, labels}
  const byName = new Map();  // sample name -> [index]

  function parseLabels(text) {
    const labels = {};
    let i = 0;
    while (i < text.length) {
      const eq = text.indexOf("=", i);
      if (eq < 0 || text[eq + 1] !== '"') break;
      const key = text.slice(i, eq).trim();
      let j = eq + 2;
      let value = "";
      while (j < text.length && text[j] !== '"') {
        if (text[j] === "\\" && j + 1 < text.length) {
          const c = text[j + 1];
          value += c === "n" ? "\n" : c;
          j += 2;
        } else {
          value += text[j];
          j += 1;
        }
      }
      labels[key] = value;
      i = j + 1;
      while (i < text.length && (text[i] === "," || text[i] === " ")) i += 1;
    }
    return labels;
  }

  function parseValue(s) {
    if (s === "+Inf") return Infinity;
    if (s === "-Inf") return -Infinity;
    return Number(s);
  }

  function idOf(key) {
    let id = ids.get(key);
    if (id !== undefined) return id;
    const brace = key.indexOf("{");
    const name = brace < 0 ? key : key.slice(0, brace);
    const labels = brace < 0 ? {} : parseLabels(key.slice(brace + 1, key.lastIndexOf("}")));
    id = meta.length;
    ids.set(key, id);
    meta.push({name, labels});
    if (!byName.has(name)) byName.set(name, []);
    byName.get(name).push(id);
    return id;
  }

  /** Where a sample line's series key (its name and labels) ends: the labels are read quote by quote, so
   *  neither a "}" inside a value nor an OpenMetrics exemplar after the value (" # {...} v t") ends it. */
  function keyEnd(line) {
    const space = line.indexOf(" ");
    const brace = line.indexOf("{");
    if (brace < 0 || (space >= 0 && space < brace)) return space;
    let quoted = false;
    for (let i = brace + 1; i < line.length; i += 1) {
      const c = line[i];
      if (quoted) {
        if (c === "\\") i += 1;
        else if (c === '"') quoted = false;
      } else if (c === '"') {
        quoted = true;
      } else if (c === "}") {
        return line[i + 1] === " " ? i + 1 : -1;
      }
    }
    return -1;
  }

  /** The samples of a text or OpenMetrics body: an array indexed by series id (undefined: absent). */
  function parse(text) {
    const values = [];
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const space = keyEnd(line);
      if (space < 0) continue;
      const rest = line.slice(space + 1).trim().split(" ");
      values[idOf(line.slice(0, space))] = parseValue(rest[0]);
    }
    return values;
  }

  // ---------------------------------------------------------------- reading two scrapes
  function matches(labels, filter) {
    for (const k in filter) {
      const want = filter[k];
      const have = labels[k] === undefined ? "" : labels[k];
      if (typeof want === "function" ? !want(have) : have !== want) return false;
    }
    return true;
  }

  /** Sums of the series of `name` matching `filter`, by the labels `by`: [{labels, now, base}]. */
  function sums(name, filter, by, cur, base) {
    const groups = new Map();
    for (const id of byName.get(name) || []) {
      const v = cur.values[id];
      if (v === undefined) continue;
      const labels = meta[id].labels;
      if (!matches(labels, filter)) continue;
      const key = by.map((k) => labels[k] || "").join("\u0000");
      let g = groups.get(key);
      if (!g) {
        g = {labels: Object.fromEntries(by.map((k) => [k, labels[k] || ""])), now: 0, base: 0};
        groups.set(key, g);
      }
      g.now += v;
      if (base) g.base += base.values[id] || 0;
    }
    return [...groups.values()];
  }

  /** histogram_quantile: Prometheus' bucketQuantile on cumulative [{le, count}] sorted by le. */
  function quantile(q, buckets) {
    if (buckets.length < 2 || buckets[buckets.length - 1].le !== Infinity) return NaN;
    for (let i = 1; i < buckets.length; i++) {  // monotonic, as Prometheus forces it
      if (buckets[i].count < buckets[i - 1].count) buckets[i].count = buckets[i - 1].count;
    }
    const total = buckets[buckets.length - 1].count;
    if (!(total > 0)) return NaN;
    let rank = q * total;
    let b = 0;
    while (b < buckets.length - 1 && buckets[b].count < rank) b += 1;
    if (b === buckets.length - 1) return buckets[buckets.length - 2].le;
    if (b === 0 && buckets[0].le <= 0) return buckets[0].le;
    let start = 0;
    let count = buckets[b].count;
    if (b > 0) {
      start = buckets[b - 1].le;
      count -= buckets[b - 1].count;
      rank -= buckets[b - 1].count;
    }
    return start + (buckets[b].le - start) * (rank / count);
  }

  /** What chart definitions read: the window (newest minus base, per second) and the whole run. */
  class Reader {
    constructor(cur, base) {
      this.cur = cur;
      this.base = base;
      this.seconds = base ? (cur.t - base.t) / 1000 : 0;
    }

    /** Counters (or a histogram's _sum/_count): rate over the window and total, by `by`. */
    counter(name, filter = {}, by = []) {
      return sums(name, filter, by, this.cur, this.base).map((g) => ({
        labels: g.labels,
        total: g.now,
        increase: this.base ? g.now - g.base : null,
        rate: this.base && this.seconds > 0 ? (g.now - g.base) / this.seconds : null,
      }));
    }

    /** Gauges: the newest value, summed (or the max) by `by`. */
    gauge(name, filter = {}, by = [], how = "sum") {
      const out = new Map();
      for (const id of byName.get(name) || []) {
        const v = this.cur.values[id];
        if (v === undefined || !matches(meta[id].labels, filter)) continue;
        const labels = Object.fromEntries(by.map((k) => [k, meta[id].labels[k] || ""]));
        const key = by.map((k) => labels[k]).join("\u0000");
        const g = out.get(key);
        if (!g) out.set(key, {labels, value: v});
        else g.value = how === "max" ? Math.max(g.value, v) : g.value + v;
      }
      return [...out.values()];
    }

    /** A histogram (base name, no suffix) by `by`: quantiles and means over the window and the whole run. */
    histogram(name, filter = {}, by = []) {
      const groups = new Map();
      for (const g of sums(`${name}_bucket`, filter, [...by, "le"], this.cur, this.base)) {
        const key = by.map((k) => g.labels[k]).join("\u0000");
        let h = groups.get(key);
        if (!h) {
          h = {labels: Object.fromEntries(by.map((k) => [k, g.labels[k]])), run: [], window: []};
          groups.set(key, h);
        }
        const le = Number(g.labels.le === "+Inf" ? Infinity : g.labels.le);
        h.run.push({le, count: g.now});
        if (this.base) h.window.push({le, count: g.now - g.base});
      }
      const sum = sums(`${name}_sum`, filter, by, this.cur, this.base);
      const count = sums(`${name}_count`, filter, by, this.cur, this.base);
      const find = (list, labels) => list.find((g) => by.every((k) => g.labels[k] === labels[k]));
      const out = [];
      for (const h of groups.values()) {
        h.run.sort((a, b) => a.le - b.le);
        h.window.sort((a, b) => a.le - b.le);
        const s = find(sum, h.labels);
        const c = find(count, h.labels);
        const n = c ? c.now - c.base : 0;
        out.push({
          labels: h.labels,
          q: (p) => (this.base ? quantile(p, h.window.map((b) => ({...b}))) : NaN),
          qRun: (p) => quantile(p, h.run.map((b) => ({...b}))),
          mean: this.base && c && s && n > 0 ? (s.now - s.base) / n : NaN,
          meanRun: c && s && c.now > 0 ? s.now / c.now : NaN,
          count: this.base && c ? n : null,
          countRun: c ? c.now : 0,
        });
      }
      return out;
    }

    has(name) {
      return (byName.get(name) || []).some((id) => this.cur.values[id] !== undefined);
    }

    /** Sample names beginning with `prefix` that the newest scrape holds, sorted. */
    names(prefix) {
      return [...byName.keys()].filter((n) => n.startsWith(prefix) && this.has(n)).sort();
    }
  }

  // ---------------------------------------------------------------- what is drawn
  const sortBy = (list, key) => list.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  const STATS = [["p50", 0.5], ["p95", 0.95], ["p99", 0.99]];
  const CORE = () => true;

  function latencyLines(r, metric, filter = {}, by = [], label = () => "", stats = STATS) {
    const lines = [];
    for (const h of sortBy(r.histogram(metric, filter, by), (h) => label(h.labels))) {
      const prefix = label(h.labels);
      for (const [name, p] of stats) {
        lines.push({key: prefix + name, name: prefix + name, value: h.q(p), run: h.qRun(p), unit: "s"});
      }
      lines.push({key: prefix + "mean", name: prefix + "mean", value: h.mean, run: h.meanRun, unit: "s"});
    }
    return lines;
  }

  const WINDOW_AND_RUN = [["value", "last {w}"], ["run", "whole run"]];

  /** A chart of a latency histogram's quantiles and mean, over the window and the whole run. */
  const latencyChart = (id, title, note, metric, {when = CORE, filter = {}, by = [], label, stats} = {}) => ({
    id, title, note, unit: "s", when, columns: WINDOW_AND_RUN,
    lines: (r) => latencyLines(r, metric, filter, by, label, stats),
  });

  /** Gauge lines: for each [metric, what, extra], one line per value of `by` (named by `naming`). */
  function gaugeLines(r, specs, by, how, naming) {
    const lines = [];
    for (const [metric, what, extra] of specs) {
      for (const g of r.gauge(metric, {}, by, how)) lines.push({...naming(what, g.labels), value: g.value, ...extra});
    }
    return lines;
  }

  const perGpu = (what, labels) => ({key: `${what} ${labels.gpu_index}`, name: `GPU ${labels.gpu_index} ${what}`});

  /** Whether the process made a generate() call (its batch sizes are counted per call, by generate() alone). */
  const GENERATE = (r) => r.counter("gpuprobe_step_batch_size_count").some((g) => g.total > 0);

  /** Requests in flight: generate() calls running, and continuous batching's requests running and waiting. */
  function inFlight(r) {
    const parts = ["gpuprobe_generate_active", "gpuprobe_requests_running", "gpuprobe_requests_waiting"]
      .map((name) => r.gauge(name).reduce((a, g) => a + g.value, 0));
    const present = ["gpuprobe_generate_active", "gpuprobe_requests_running"].some((n) => r.has(n));
    return {value: present ? parts[0] + parts[1] + parts[2] : null, running: parts[1], waiting: parts[2],
            batching: r.has("gpuprobe_requests_running")};
  }

  const MEMORY_ORDER = ["allocated", "peak", "reserved"];

  /** Whether a diffusers pipeline ran (its denoising steps are counted): the diffusion charts show from then on. */
  const DIFFUSION = (r) => r.counter("gpuprobe_diffusion_step_duration_seconds_count").some((g) => g.total > 0);
  const DENOISING_PARTS = ["denoiser", "controlnet", "scheduler", "other"];  // they add up to a denoising step
  const CALL_PARTS = ["text_encoder", "vae_encode", "vae_decode", "safety_checker"];  // before or after the steps
  const partName = (labels) => labels.component.replace(/_/g, " ")
    + (labels.module && labels.module !== labels.component ? ` (${labels.module})` : "");

  const clockLabel = (labels) => (labels.clock && labels.clock !== "host" ? `${labels.clock} ` : "");
  const COMPONENT_ORDER = ["draft", "schedule", "forward", "verify", "logits_processor", "stopping_criteria",
                           "streamer", "update", "other"];

  const CHARTS = [
    {
      id: "tokens", title: "Tokens per second", unit: "tok/s", when: CORE,
      note: "Prompt and generated tokens, counted as each request ends (a generate() call, a continuous-batching "
        + "request).",
      columns: [["value", "last {w}"], ["run", "whole run"]],
      lines: (r) => sortBy(r.counter("gen_ai_client_token_usage_sum", {}, ["gen_ai_token_type"]),
                           (g) => (g.labels.gen_ai_token_type === "output" ? 0 : 1)).map((g) => ({
        key: g.labels.gen_ai_token_type, name: g.labels.gen_ai_token_type || "tokens",
        value: g.rate, unit: "tok/s", run: g.total, runUnit: "tokens",
      })),
    },
    latencyChart("ttft", "Time to first token",
                 "From the generate() call (or the request's arrival) to its first new token.",
                 "gen_ai_server_time_to_first_token_seconds", {by: ["clock"], label: clockLabel}),
    latencyChart("tpot", "Time per output token",
                 "Per request: (duration − time to first token) ÷ (output tokens − 1).",
                 "gen_ai_server_time_per_output_token_seconds"),
    {
      id: "components", title: "Step time by component", unit: "s", when: CORE, stack: true, wide: true,
      note: "Mean time per generation step in each part of the loop, stacked: they add up to the step.",
      columns: [["value", "last {w}"], ["share", "share"], ["run", "whole run"]],
      lines: (r) => {
        const steps = r.counter("gpuprobe_step_duration_seconds_count", {clock: "host"});
        const stepsNow = steps.reduce((a, g) => a + (g.increase || 0), 0);
        const stepsRun = steps.reduce((a, g) => a + g.total, 0);
        const parts = r.counter("gpuprobe_step_component_duration_seconds_sum", {}, ["component", "processor"]);
        const rank = (g) => {
          const i = COMPONENT_ORDER.indexOf(g.labels.component);
          return `${String(i < 0 ? 99 : i).padStart(2, "0")} ${g.labels.processor}`;
        };
        const lines = sortBy(parts, rank).map((g) => ({
          key: `${g.labels.component}/${g.labels.processor}`,
          name: g.labels.component === "logits_processor" && g.labels.processor ? g.labels.processor
            : g.labels.component.replace(/_/g, " "),
          value: g.increase !== null && stepsNow > 0 ? g.increase / stepsNow : null,
          run: stepsRun > 0 ? g.total / stepsRun : null,
          unit: "s",
        }));
        const total = lines.reduce((a, l) => a + (l.value || 0), 0);
        for (const l of lines) l.share = total > 0 && l.value !== null ? l.value / total : null;
        return lines;
      },
    },
    latencyChart("itl", "Inter-token latency", "Between two consecutive output tokens of a request.",
                 "gpuprobe_inter_token_duration_seconds", {by: ["clock"], label: clockLabel}),
    latencyChart("phases", "Step time by phase",
                 "One forward step on the host clock: prompt (prefill) and one token (decode).",
                 "gpuprobe_step_duration_seconds",
                 {filter: {clock: "host"}, by: ["phase"], label: (l) => `${l.phase} `, stats: [["p95", 0.95]]}),
    {
      id: "requests", title: "Requests", unit: "/s", unit2: "count", when: CORE,
      note: "Requests in flight (generate() calls; continuous batching: running + waiting), and requests ending "
        + "per second (failed: by exception type).",
      columns: [["value", "last {w}"], ["run", "whole run"]],
      lines: (r) => {
        const now = inFlight(r);
        const lines = now.value === null ? [] : [{key: "active", name: "in flight", value: now.value, unit: "count",
                                                  scale: "y2", run: null}];
        for (const g of r.counter("gen_ai_server_request_duration_seconds_count", {}, ["error_type"])) {
          const failed = g.labels.error_type !== "";
          lines.push({key: failed ? `failed ${g.labels.error_type}` : "completed",
                      name: failed ? `failed: ${g.labels.error_type}` : "completed",
                      value: g.rate, unit: "/s", run: g.total, runUnit: "count"});
        }
        return lines;
      },
    },
    {
      id: "memory", title: "Memory", unit: "bytes", when: CORE,
      note: "Allocated bytes (CUDA allocator; process RSS on a CPU), their high-water mark, and every other "
        + "memory gauge the process has.",
      columns: [["value", "now"]],
      lines: (r) => {
        const what = (name) => name.slice("gpuprobe_memory_".length).replace(/_bytes$/, "");
        const rank = (name) => {
          const i = MEMORY_ORDER.indexOf(what(name));
          return `${i < 0 ? 9 : i} ${what(name)}`;
        };
        const names = sortBy(r.names("gpuprobe_memory_").filter((n) => n.endsWith("_bytes")), rank);
        return gaugeLines(r, names.map((n) => [n, what(n).replace(/_/g, " "), {unit: "bytes"}]), ["device"], "sum",
                          (w, l) => ({key: `${w} ${l.device}`, name: `${w} (${l.device})`}));
      },
    },
    {
      id: "kv", title: "KV cache", unit: "bytes", unit2: "tokens", when: GENERATE,
      note: "Bytes the cache of the running generate() call holds, and the tokens in it (shown once the process "
        + "made a generate() call; continuous batching's paged cache is in its own chart).",
      columns: [["value", "now"]],
      lines: (r) => [
        ...r.gauge("gpuprobe_kv_cache_memory_bytes", {}, ["model"]).map((g) => ({
          key: `bytes ${g.labels.model}`, name: `bytes ${g.labels.model}`, value: g.value, unit: "bytes"})),
        ...r.gauge("gpuprobe_kv_cache_sequence_length", {}, ["model"], "max").map((g) => ({
          key: `tokens ${g.labels.model}`, name: `tokens ${g.labels.model}`, value: g.value, unit: "tokens",
          scale: "y2"})),
      ],
    },
    latencyChart("denoise", "Denoising step", "One denoising step of each diffusers pipeline, by clock (shown once a "
                 + "pipeline ran).", "gpuprobe_diffusion_step_duration_seconds",
                 {when: DIFFUSION, by: ["model", "clock"], label: (l) => `${l.model} ${clockLabel(l)}`,
                  stats: [["p95", 0.95]]}),
    {
      id: "diffusion_components", title: "Denoising step by component", unit: "s", when: DIFFUSION, stack: true,
      wide: true,
      note: "Mean time per denoising step of each pipeline in each of its parts: the denoiser by branch (cond, uncond, "
        + "batched for both in one forward), a ControlNet, the scheduler's step, the rest. Stacked, a pipeline's "
        + "add up to its step; the share is of its step.",
      columns: [["value", "last {w}"], ["share", "share"], ["run", "whole run"]],
      lines: (r) => {
        const steps = new Map(r.counter("gpuprobe_diffusion_step_duration_seconds_count", {clock: "host"}, ["model"])
          .map((g) => [g.labels.model, g]));
        const parts = r.counter("gpuprobe_diffusion_component_duration_seconds_sum",
                                {clock: "host", component: (c) => DENOISING_PARTS.includes(c)},
                                ["model", "component", "branch"]);
        const rank = (g) => `${g.labels.model}\u0000${DENOISING_PARTS.indexOf(g.labels.component)} ${g.labels.branch}`;
        const lines = sortBy(parts, rank).map((g) => {
          const s = steps.get(g.labels.model);
          return {
            key: `${g.labels.model}/${g.labels.component}/${g.labels.branch}`, model: g.labels.model,
            name: `${g.labels.model} ${g.labels.component}${g.labels.branch ? ` ${g.labels.branch}` : ""}`,
            value: g.increase !== null && s && s.increase > 0 ? g.increase / s.increase : null,
            run: s && s.total > 0 ? g.total / s.total : null,
            unit: "s",
          };
        });
        const totals = new Map();
        for (const l of lines) totals.set(l.model, (totals.get(l.model) || 0) + (l.value || 0));
        for (const l of lines) {
          const total = totals.get(l.model);
          l.share = total > 0 && l.value !== null ? l.value / total : null;
        }
        return lines;
      },
    },
    {
      id: "diffusion_rates", title: "Denoising steps and images", unit: "/s", when: DIFFUSION,
      note: "Denoising steps and images (videos, latents) per second of each diffusers pipeline; the whole run "
        + "counts them.",
      columns: [["value", "last {w}"], ["run", "whole run"]],
      lines: (r) => {
        const lines = [];
        const counted = [["steps", "gpuprobe_diffusion_step_duration_seconds_count", {clock: "host"}],
                         ["images", "gpuprobe_diffusion_images_total", {}]];
        for (const [what, name, filter] of counted) {
          for (const g of sortBy(r.counter(name, filter, ["model"]), (x) => x.labels.model)) {
            lines.push({key: `${what} ${g.labels.model}`, name: `${what} ${g.labels.model}`, value: g.rate, unit: "/s",
                        run: g.total, runUnit: "count"});
          }
        }
        return lines;
      },
    },
    {
      id: "diffusion_parts", title: "Pipeline components outside the steps", unit: "s", when: DIFFUSION,
      note: "Mean time of one call of each component a pipeline call runs before or after its denoising steps: the "
        + "text encoders, the VAE's encode and decode, a safety checker.",
      columns: WINDOW_AND_RUN,
      lines: (r) => {
        const filter = {clock: "host", component: (c) => CALL_PARTS.includes(c)};
        const by = ["model", "component", "module"];
        const keyOf = (l) => `${l.model}/${l.component}/${l.module}`;
        const counts = new Map(r.counter("gpuprobe_diffusion_component_duration_seconds_count", filter, by)
          .map((g) => [keyOf(g.labels), g]));
        const rank = (g) => `${g.labels.model}\u0000${CALL_PARTS.indexOf(g.labels.component)} ${g.labels.module}`;
        return sortBy(r.counter("gpuprobe_diffusion_component_duration_seconds_sum", filter, by), rank).map((g) => {
          const c = counts.get(keyOf(g.labels));
          return {
            key: keyOf(g.labels), name: `${g.labels.model} ${partName(g.labels)}`, unit: "s",
            value: g.increase !== null && c && c.increase > 0 ? g.increase / c.increase : null,
            run: c && c.total > 0 ? g.total / c.total : null,
          };
        });
      },
    },
    {
      id: "diffusion_memory", title: "Pipeline memory peak by component", unit: "bytes", when: DIFFUSION,
      note: "The memory high-water mark at the end of each component of a pipeline call, and of its denoising loop "
        + "(denoiser): the VAE decode's is where a large image runs out of memory.",
      columns: [["value", "now"]],
      lines: (r) => {
        const by = ["model", "component", "module", "device"];
        const keyOf = (l) => by.map((k) => l[k]).join("/");
        return sortBy(r.gauge("gpuprobe_diffusion_component_memory_peak_bytes", {}, by, "max"), (g) => keyOf(g.labels))
          .map((g) => ({key: keyOf(g.labels), name: `${g.labels.model} ${partName(g.labels)} (${g.labels.device})`,
                        value: g.value, unit: "bytes"}));
      },
    },
    latencyChart("probes", "Your probes", "Mean and p95 of each @probe / with probe() region of the program.",
                 "gpuprobe_probe_duration_seconds",
                 {when: (r) => r.has("gpuprobe_probe_duration_seconds_count"), by: ["probe", "clock"],
                  label: (l) => `${l.probe} ${clockLabel(l)}`, stats: [["p95", 0.95]]}),
    {
      id: "serving", title: "Continuous batching", unit: "count", unit2: "%",
      when: (r) => r.has("gpuprobe_requests_running"),
      note: "Requests the scheduler runs and keeps waiting, and the share of the paged KV cache in use.",
      columns: [["value", "now"]],
      lines: (r) => [
        ...r.gauge("gpuprobe_requests_running").map((g) => ({key: "running", name: "running", value: g.value,
                                                               unit: "count"})),
        ...r.gauge("gpuprobe_requests_waiting").map((g) => ({key: "waiting", name: "waiting", value: g.value,
                                                               unit: "count"})),
        ...r.gauge("gpuprobe_kv_cache_usage_ratio", {}, [], "max").map((g) => ({
          key: "kv", name: "KV cache in use", value: g.value, unit: "%", scale: "y2"})),
      ],
    },
    latencyChart("queue", "Queue time", "From a request's arrival to the first step that schedules it.",
                 "gpuprobe_request_queue_duration_seconds",
                 {when: (r) => r.has("gpuprobe_request_queue_duration_seconds_count")}),
    {
      id: "speculative", title: "Draft acceptance", unit: "%",
      when: (r) => r.has("gpuprobe_speculative_draft_tokens_total"),
      note: "Draft tokens the main model accepted ÷ draft tokens proposed, by method.",
      columns: [["value", "last {w}"], ["run", "whole run"]],
      lines: (r) => {
        const accepted = r.counter("gpuprobe_speculative_accepted_tokens_total", {}, ["method"]);
        return r.counter("gpuprobe_speculative_draft_tokens_total", {}, ["method"]).map((p) => {
          const a = accepted.find((g) => g.labels.method === p.labels.method);
          return {key: p.labels.method, name: p.labels.method, unit: "%",
                  value: a && p.increase > 0 ? a.increase / p.increase : null,
                  run: a && p.total > 0 ? a.total / p.total : null};
        });
      },
    },
    {
      id: "gpu", title: "GPU utilization", unit: "%", when: (r) => r.has("gpuprobe_gpu_utilization_ratio"),
      note: "NVML: time a kernel ran, and the SMs' and tensor cores' activity where the GPU reports it.",
      columns: [["value", "now"]],
      lines: (r) => gaugeLines(r, [["gpuprobe_gpu_utilization_ratio", "utilization", {unit: "%"}],
                                   ["gpuprobe_gpu_sm_activity_ratio", "SM activity", {unit: "%"}],
                                   ["gpuprobe_gpu_tensor_activity_ratio", "tensor cores", {unit: "%"}]],
                               ["gpu_index"], "max", perGpu),
    },
    {
      id: "gpu_memory", title: "GPU memory", unit: "bytes", when: (r) => r.has("gpuprobe_gpu_memory_used_bytes"),
      note: "NVML: device memory used by every process on the GPU, and its total.",
      columns: [["value", "now"]],
      lines: (r) => gaugeLines(r, [["gpuprobe_gpu_memory_used_bytes", "used", {unit: "bytes"}],
                                   ["gpuprobe_gpu_memory_total_bytes", "total", {unit: "bytes"}]],
                               ["gpu_index"], "max", perGpu),
    },
    {
      id: "gpu_power", title: "GPU power and temperature", unit: "W", unit2: "°C",
      when: (r) => r.has("gpuprobe_gpu_power_watts"),
      note: "NVML: power draw and its limit, temperature, and the SM clock (throttling lowers it).",
      columns: [["value", "now"]],
      lines: (r) => {
        const lines = gaugeLines(r, [["gpuprobe_gpu_power_watts", "power", {unit: "W"}],
                                     ["gpuprobe_gpu_power_limit_watts", "power limit", {unit: "W"}],
                                     ["gpuprobe_gpu_temperature_celsius", "temperature", {unit: "°C", scale: "y2"}],
                                     ["gpuprobe_gpu_clock_sm_hertz", "SM clock", {unit: "Hz", plot: false}]],
                                 ["gpu_index"], "max", perGpu);
        for (const g of r.gauge("gpuprobe_gpu_throttle_ratio", {}, ["gpu_index", "reason"], "max")) {
          if (g.value > 0 && g.labels.reason !== "gpu_idle") {
            lines.push({key: `throttle ${g.labels.gpu_index} ${g.labels.reason}`,
                        name: `GPU ${g.labels.gpu_index} throttled: ${g.labels.reason}`, value: g.value, unit: "%",
                        plot: false});
          }
        }
        return lines;
      },
    },
  ];

  const TILES = [
    {id: "tokens_per_second", label: "output tokens/s", title: "generated tokens per second over the window", unit: "tok/s", read: (r) => {
      const g = r.counter("gen_ai_client_token_usage_sum", {gen_ai_token_type: "output"});
      const total = g.reduce((a, x) => a + x.total, 0);
      return {value: g.length ? g.reduce((a, x) => a + (x.rate || 0), 0) : null,
              sub: `${fmt(total, "tokens")} in all`};
    }},
    {id: "ttft_p50", label: "TTFT p50", title: "time to first token, median over the window", unit: "s", read: (r) => {
      const h = r.histogram("gen_ai_server_time_to_first_token_seconds", {clock: (c) => c !== "device"});
      return {value: h.length ? h[0].q(0.5) : null, sub: h.length ? `whole run ${fmt(h[0].qRun(0.5), "s")}` : ""};
    }},
    {id: "tpot_p50", label: "TPOT p50", title: "time per output token, median over the window", unit: "s", read: (r) => {
      const h = r.histogram("gen_ai_server_time_per_output_token_seconds");
      return {value: h.length ? h[0].q(0.5) : null, sub: h.length ? `whole run ${fmt(h[0].qRun(0.5), "s")}` : ""};
    }},
    {id: "step_mean", label: "mean step", unit: "s", read: (r) => {
      const h = r.histogram("gpuprobe_step_duration_seconds", {clock: "host"});
      return {value: h.length ? h[0].mean : null, sub: h.length ? `${fmt(h[0].countRun, "count")} steps` : ""};
    }},
    {id: "in_flight", label: "requests in flight", title: "generate() calls running, and under continuous batching "
      + "the requests running and waiting", unit: "count", read: (r) => {
      const now = inFlight(r);
      const done = r.counter("gen_ai_server_request_duration_seconds_count", {}, ["error_type"]);
      const ok = done.filter((x) => x.labels.error_type === "").reduce((a, x) => a + x.total, 0);
      const failed = done.filter((x) => x.labels.error_type !== "").reduce((a, x) => a + x.total, 0);
      const batching = now.batching
        ? `${fmt(now.running, "count")} running, ${fmt(now.waiting, "count")} waiting · ` : "";
      return {value: now.value,
              sub: batching + `${fmt(ok, "count")} done` + (failed ? `, ${fmt(failed, "count")} failed` : "")};
    }},
    {id: "memory", label: "memory allocated", unit: "bytes", read: (r) => {
      const a = r.gauge("gpuprobe_memory_allocated_bytes");
      const p = r.gauge("gpuprobe_memory_peak_bytes");
      return {value: a.length ? a[0].value : null, sub: p.length ? `peak ${fmt(p[0].value, "bytes")}` : ""};
    }},
  ];

  // ---------------------------------------------------------------- formatting
  function sig(x) {
    const a = Math.abs(x);
    if (a >= 100) return x.toFixed(0);
    if (a >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }

  function fmt(v, unit) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "—";
    switch (unit) {
      case "s":
        if (v === 0) return "0 s";
        if (Math.abs(v) < 1e-3) return `${sig(v * 1e6)} µs`;
        if (Math.abs(v) < 1) return `${sig(v * 1e3)} ms`;
        return `${sig(v)} s`;
      case "bytes": {
        const units = ["B", "KiB", "MiB", "GiB", "TiB"];
        let i = 0;
        let x = v;
        while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i += 1; }
        return `${i ? sig(x) : x.toFixed(0)} ${units[i]}`;
      }
      case "%": return `${(v * 100).toFixed(1)} %`;
      case "Hz": return `${(v / 1e6).toFixed(0)} MHz`;
      case "count": return Math.round(v).toLocaleString("en-US");
      case "tokens": return `${Math.round(v).toLocaleString("en-US")} tokens`;
      default: return `${sig(v)} ${unit}`;
    }
  }

  function fmtAxis(v, unit) {
    if (unit === "%") return `${Math.round(v * 100)}%`;
    if (unit === "count" || unit === "tokens") return Math.abs(v) >= 1000 ? `${sig(v / 1000)}k` : `${+v.toFixed(2)}`;
    const text = fmt(v, unit);
    return text === "—" ? "" : text.replace(" tok/s", "").replace(" /s", "");
  }

  const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString("en-GB", {hour12: false});

  // ---------------------------------------------------------------- the DOM
  const $ = (sel) => document.querySelector(sel);
  const el = (tag, attrs = {}, text = "") => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text) e.textContent = text;
    return e;
  };
  const dataValue = (v) => (v === null || v === undefined || !Number.isFinite(v) ? "" : String(v));

  let windowS = 60;
  const state = {scrapes: [], xs: [], seq: 0, charts: new Map(), lastOk: 0, error: null, requests: 0};
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("window")) windowS = Math.min(MAX_WINDOW_S, Math.max(2, Number(params.get("window")) || 60));
  const select = $("#window");
  if (![...select.options].some((o) => Number(o.value) === windowS)) {
    select.appendChild(el("option", {value: String(windowS)}, `${windowS} s`));
  }
  select.value = String(windowS);
  select.addEventListener("change", () => {
    windowS = Number(select.value);
    history.replaceState(null, "", `#window=${windowS}`);
    if (state.scrapes.length) update();
  });
  const windowText = () => (windowS % 60 === 0 ? `${windowS / 60} min` : `${windowS} s`);

  function makeCard(chart) {
    const card = el("section", {class: chart.wide ? "card wide" : "card", "data-chart": chart.id});
    card.appendChild(el("h2", {}, chart.title));
    card.appendChild(el("p", {class: "note"}, chart.note));
    const plot = el("div", {class: "plot"});
    const empty = el("div", {class: "empty"}, "no data yet");
    plot.appendChild(empty);
    card.appendChild(plot);
    const table = el("table");
    card.appendChild(table);
    $("#charts").appendChild(card);
    const view = {chart, card, plot, empty, table, keys: [], info: new Map(), colors: new Map(), data: new Map(),
                  u: null, width: 0};
    new ResizeObserver(() => resize(view)).observe(plot);
    return view;
  }

  function resize(view) {
    const width = Math.floor(view.plot.clientWidth);
    if (view.u && width > 0 && width !== view.width) {
      view.width = width;
      view.u.setSize({width, height: 190});
    }
  }

  function plotData(view) {
    const keys = view.keys.filter((k) => view.info.get(k).plot !== false);
    let series = keys.map((k) => view.data.get(k));
    if (view.chart.stack) {  // cumulative sums, bottom first, for the stacked areas
      const acc = new Array(state.xs.length).fill(null);
      series = series.map((s) => s.map((v, i) => {
        if (v === null || v === undefined) return acc[i];
        acc[i] = (acc[i] || 0) + v;
        return acc[i];
      }).slice());
    }
    return {keys, data: [state.xs.slice(), ...series]};
  }

  function build(view) {
    if (view.u) view.u.destroy();
    const {keys, data} = plotData(view);
    const chart = view.chart;
    const series = [{}];
    const bands = [];
    keys.forEach((k, i) => {
      const color = view.colors.get(k);
      const info = view.info.get(k);
      series.push({
        label: info.name, stroke: color, width: 1.6, scale: info.scale || "y", spanGaps: false,
        points: {show: false}, fill: chart.stack ? `${color}55` : undefined,
      });
      if (chart.stack && i > 0) bands.push({series: [i + 1, i], fill: `${color}55`});
    });
    const axis = (scale, unit, side) => ({
      scale, side, stroke: TEXT, size: 64, grid: {show: side === 3, stroke: GRID, width: 1},
      ticks: {show: false}, values: (u, vals) => vals.map((v) => fmtAxis(v, unit)),
      font: "11px system-ui, sans-serif",
    });
    const hasY2 = keys.some((k) => view.info.get(k).scale === "y2");
    const range = (u, min, max) => [0, max > 0 ? max * 1.1 : 1];
    const opts = {
      width: Math.max(200, Math.floor(view.plot.clientWidth)), height: 190,
      legend: {show: false},
      cursor: {drag: {x: false, y: false}, points: {size: 5}},
      series, bands,
      scales: {x: {time: true}, y: {range}, y2: {range}},
      axes: [
        {stroke: TEXT, grid: {stroke: GRID, width: 1}, ticks: {show: false}, font: "11px system-ui, sans-serif",
         space: 70, values: (u, vals) => vals.map(clock)},
        axis("y", chart.unit, 3),
        ...(hasY2 ? [axis("y2", chart.unit2 || chart.unit, 1)] : []),
      ],
    };
    view.width = opts.width;
    view.u = new uPlot(opts, data, view.plot);
    view.plotted = keys.join("\u0000");
  }

  function renderTable(view, lines) {
    const chart = view.chart;
    const head = el("tr");
    head.appendChild(el("th", {}, ""));
    for (const [, title] of chart.columns) head.appendChild(el("th", {}, title.replace("{w}", windowText())));
    const rows = [head];
    for (const line of lines) {
      const tr = el("tr", {"data-line": line.key});
      const first = el("td", {title: line.name});
      const sw = el("span", {class: "swatch"});
      sw.style.background = view.colors.get(line.key);
      first.appendChild(sw);
      first.appendChild(document.createTextNode(line.name));
      tr.appendChild(first);
      for (const [col] of chart.columns) {
        const v = line[col];
        const unit = col === "share" ? "%" : col === "run" ? line.runUnit || line.unit : line.unit;
        tr.appendChild(el("td", {"data-col": col, "data-value": dataValue(v)},
                          col === "run" && v === null ? "—" : fmt(v, unit)));
      }
      rows.push(tr);
    }
    view.table.replaceChildren(...rows);
  }

  function renderTiles(r) {
    const tiles = TILES.map((t) => {
      const {value, sub} = t.read(r);
      const tile = el("div", {class: "tile", "data-tile": t.id, title: t.title || t.label});
      tile.appendChild(el("div", {class: "label"}, t.label));
      tile.appendChild(el("div", {class: "value", "data-value": dataValue(value)}, fmt(value, t.unit)));
      tile.appendChild(el("div", {class: "sub"}, sub || "\u00a0"));
      return tile;
    });
    $("#tiles").replaceChildren(...tiles);
  }

  function renderBuild(r) {
    const info = r.gauge("gpuprobe_build_info", {}, ["gpuprobe_version", "torch_version", "transformers_version",
                                                    "python_version", "device_name", "gpuprobe_rank"]);
    const models = new Set(r.gauge("gpuprobe_generate_active", {}, ["model"]).map((g) => g.labels.model));
    const box = $("#build");
    box.replaceChildren();
    if (!info.length) return;
    const b = info[0].labels;
    const part = (label, value) => {
      if (!value) return;
      if (box.childNodes.length) box.appendChild(document.createTextNode(" · "));
      box.appendChild(document.createTextNode(`${label} `));
      box.appendChild(el("b", {}, value));
    };
    part(models.size > 1 ? "models" : "model", [...models].join(", "));
    part("device", b.device_name);
    part("rank", b.gpuprobe_rank);
    part("gpuprobe", b.gpuprobe_version);
    part("torch", b.torch_version);
    part("transformers", b.transformers_version);
  }

  // ---------------------------------------------------------------- each scrape
  /** The oldest scrape of `list` within the window before `cur` (the window's older end), or null. */
  function baseIn(list, cur) {
    const from = cur.t - windowS * 1000 - 250;  // a scrape a poll late still opens the window
    for (const s of list) {
      if (s !== cur && s.t >= from) return s;
    }
    return null;
  }

  const baseFor = (cur) => baseIn(state.scrapes, cur);

  /** One point at `t` (ms) on every chart, from what `r` reads; its table too, and the plot, unless `quiet`. */
  function draw(r, t, quiet) {
    state.xs.push(t / 1000);
    const drop = Math.max(0, state.xs.length - KEEP_POINTS);
    if (drop) state.xs.splice(0, drop);
    for (const chart of CHARTS) {
      let view = state.charts.get(chart.id);
      if (!view && !chart.when(r)) continue;
      if (!view) {
        view = makeCard(chart);
        state.charts.set(chart.id, view);
      }
      const lines = chart.lines(r);
      for (const line of lines) {
        if (!view.info.has(line.key)) {
          view.keys.push(line.key);
          view.colors.set(line.key, COLORS[(view.keys.length - 1) % COLORS.length]);
          view.data.set(line.key, new Array(state.xs.length - 1).fill(null));
        }
        view.info.set(line.key, line);
      }
      const now = new Map(lines.map((l) => [l.key, l.value]));
      for (const k of view.keys) {
        const arr = view.data.get(k);
        const v = now.get(k);
        arr.push(v === null || v === undefined || !Number.isFinite(v) ? null : v);
        if (drop) arr.splice(0, drop);
      }
      if (quiet) continue;
      const order = new Map(view.keys.map((k, i) => [k, i]));
      renderTable(view, lines.slice().sort((a, b) => order.get(a.key) - order.get(b.key)));
      plot(view, r.base !== null);
    }
  }

  function plot(view, windowOpen) {
    const anything = view.keys.some((k) => view.data.get(k).some((v) => v !== null));
    view.empty.textContent = anything ? "" : (windowOpen ? "no data in this window"
      : "collecting: a second scrape opens the window");
    const wanted = view.keys.filter((k) => view.info.get(k).plot !== false).join("\u0000");
    if (!view.u || view.plotted !== wanted) build(view);
    else view.u.setData(plotData(view).data);
  }

  function update() {
    const cur = state.scrapes[state.scrapes.length - 1];
    const base = baseFor(cur);
    const r = new Reader(cur, base);
    document.body.dataset.scrape = String(cur.seq);
    document.body.dataset.base = base ? String(base.seq) : "";
    document.body.dataset.seconds = base ? String(r.seconds) : "";
    document.body.dataset.window = String(windowS);
    renderBuild(r);
    renderTiles(r);
    draw(r, cur.t, false);
  }

  function reset(cur) {
    // The process restarted (or its counters were reset): what was kept no longer adds up.
    state.scrapes = [cur];
    state.xs = [];
    for (const view of state.charts.values()) {
      for (const k of view.keys) view.data.set(k, []);
    }
  }

  function restarted(prev, cur) {
    for (const [name, ids_] of byName) {
      if (!(name.endsWith("_total") || name.endsWith("_count"))) continue;
      for (const id of ids_) {
        const a = prev.values[id];
        const b = cur.values[id];
        if (a !== undefined && (b === undefined || b < a)) return true;
      }
    }
    return false;
  }

  // ---------------------------------------------------------------- the history
  /** Draw the server's history (its scrapes before the page opened) as the charts' first points. */
  async function loadHistory() {
    document.body.dataset.history = "0";
    let answer;
    let sent;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 10000);
    try {
      sent = Date.now();
      const resp = await fetch(HISTORY_PATH, {cache: "no-store", signal: abort.signal});
      if (!resp.ok) return;
      const now = Number(resp.headers.get("X-Gpuprobe-Now"));
      answer = await resp.json();
      // The server's clock to the page's: its "now" is the moment between sending and receiving.
      answer.offset = Number.isFinite(now) && now > 0 ? (sent + Date.now()) / 2 - now * 1000 : 0;
    } catch (err) {
      return;  // no history (an older server, a slow answer): the page starts from its own scrapes
    } finally {
      clearTimeout(timer);
    }
    const series = Array.isArray(answer.series) ? answer.series.map((key) => idOf(String(key))) : [];
    const past = [];
    let drawn = 0;
    for (const scrape of Array.isArray(answer.scrapes) ? answer.scrapes : []) {
      const values = [];
      const row = Array.isArray(scrape.values) ? scrape.values : [];
      for (let i = 0; i < row.length && i < series.length; i++) {
        if (typeof row[i] === "number") values[series[i]] = row[i];
      }
      const cur = {t: Number(scrape.t) * 1000 + answer.offset, values};
      if (!Number.isFinite(cur.t) || cur.t > Date.now()) continue;
      if (past.length && (restarted(past[past.length - 1], cur) || cur.t <= past[past.length - 1].t)) past.length = 0;
      past.push(cur);
      while (past.length > 2 && past[1].t < cur.t - (MAX_WINDOW_S + 5) * 1000) past.shift();
      draw(new Reader(cur, baseIn(past, cur)), cur.t, true);
      drawn += 1;
    }
    document.body.dataset.history = String(drawn);
    for (const view of state.charts.values()) plot(view, true);
  }

  // ---------------------------------------------------------------- the requests table
  const IN_FLIGHT_COLUMNS = [["request_id", "request"], ["model", "model"], ["state", "state"], ["age_s", "age", "s"],
                             ["output_tokens", "tokens so far", "count"], ["tokens_per_s", "tokens/s", "tok/s"],
                             ["kv_blocks", "KV blocks", "count"]];
  const FINISHED_COLUMNS = [["request_id", "request"], ["model", "model"], ["finish_reason", "finish"],
                            ["ttft_s", "TTFT", "s"], ["tpot_s", "TPOT", "s"], ["duration_s", "duration", "s"],
                            ["input_tokens", "prompt", "count"], ["output_tokens", "tokens", "count"]];
  const asText = (v) => (v === null || v === undefined ? "" : String(v).slice(0, 256));

  /** Rows of requests into `table`: every value set as text (an id is the client's), numbers formatted. */
  function requestRows(table, columns, rows, none) {
    const head = el("tr");
    for (const [, title, unit] of columns) head.appendChild(el("th", unit ? {} : {class: "text"}, title));
    const out = [head];
    for (const row of rows) {
      const tr = el("tr", {"data-request": asText(row.request_id)});
      for (const [key, , unit] of columns) {
        const v = row[key];
        if (unit) {
          tr.appendChild(el("td", {"data-col": key, "data-value": typeof v === "number" ? dataValue(v) : ""},
                            typeof v === "number" ? fmt(v, unit) : "—"));
        } else {
          const text = asText(v);
          tr.appendChild(el("td", {"data-col": key, "data-value": text, class: "text", title: text}, text || "—"));
        }
      }
      out.push(tr);
    }
    if (!rows.length) {
      const tr = el("tr", {class: "none"});
      tr.appendChild(el("td", {colspan: String(columns.length), class: "text"}, none));
      out.push(tr);
    }
    table.replaceChildren(...out);
  }

  function renderRequests(data) {
    const running = Array.isArray(data.in_flight) ? data.in_flight : [];
    const finished = (Array.isArray(data.finished) ? data.finished : []).slice(-FINISHED_SHOWN).reverse();
    const total = Number.isFinite(data.in_flight_total) ? data.in_flight_total : running.length;
    requestRows($("#in-flight"), IN_FLIGHT_COLUMNS, running, "no request running now");
    requestRows($("#finished"), FINISHED_COLUMNS, finished, "no request has ended yet");
    $("#in-flight-note").textContent = total > running.length
      ? `the oldest ${fmt(running.length, "count")} of ${fmt(total, "count")}` : `${fmt(total, "count")} now`;
    const ended = Number.isFinite(data.ended) ? data.ended : finished.length;
    $("#finished-note").textContent = `newest first: ${fmt(finished.length, "count")} of ${fmt(ended, "count")} ended`
      + (Number.isFinite(data.kept) ? ` (the program keeps the newest ${fmt(data.kept, "count")}: gpuprobe.requests())`
        : "");
    const box = $("#requests");
    box.hidden = false;
    box.dataset.inFlight = String(total);
    box.dataset.ended = String(ended);
  }

  async function pollRequests() {
    try {
      const resp = await fetch(REQUESTS_PATH, {cache: "no-store"});
      if (resp.status === 404) return;  // a server without the table
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      renderRequests(await resp.json());
      state.requests += 1;
      document.body.dataset.requests = String(state.requests);
      $("#requests-status").textContent = "";
    } catch (err) {
      $("#requests-status").textContent = `cannot read /requests (${err && err.message ? err.message : err}); retrying`;
    }
  }

  // ---------------------------------------------------------------- polling
  function setStatus() {
    const status = $("#status");
    if (state.error) {
      status.className = "status error";
      status.textContent = `cannot read /metrics (${state.error}); retrying`;
      return;
    }
    const cur = state.scrapes[state.scrapes.length - 1];
    const base = cur && baseFor(cur);
    status.className = "status live";
    status.textContent = base ? `live · ${((cur.t - base.t) / 1000).toFixed(0)} s of scrapes in the window`
      : "live · collecting the window";
  }

  async function poll() {
    const started = Date.now();
    const requests = pollRequests();
    try {
      const resp = await fetch("/metrics", {headers: {Accept: ACCEPT}, cache: "no-store"});
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const text = await resp.text();
      const cur = {t: Date.now(), seq: state.seq + 1, values: parse(text)};
      state.seq = cur.seq;
      const prev = state.scrapes[state.scrapes.length - 1];
      if (prev && restarted(prev, cur)) reset(cur);
      else state.scrapes.push(cur);
      const oldest = cur.t - (MAX_WINDOW_S + 5) * 1000;
      while (state.scrapes.length > 2 && state.scrapes[1].t < oldest) state.scrapes.shift();
      state.error = null;
      update();
    } catch (err) {
      state.error = err && err.message ? err.message : String(err);
    }
    await requests;
    setStatus();
    setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
  }

  // For tests and the curious: what each chart draws.
  window.gpuprobeLive = {
    charts: () => Object.fromEntries([...state.charts].map(([id, v]) => [id, {
      x: state.xs.slice(), lines: Object.fromEntries(v.keys.map((k) => [k, v.data.get(k).slice()])),
    }])),
    quantile,
  };
  loadHistory().finally(poll);
})();

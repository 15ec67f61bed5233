// The gradfuse page: asks /ask (streamed as server-sent events or in one reply) and shows why it answered
// what it answered. No framework and nothing loaded from outside this server.
"use strict";

const $ = (id) => document.getElementById(id);
// What the latency bar shows, in pipeline order; "fusion" is what ranking took besides the steps it names.
const TIMING_STEPS = [
  ["retrieval", "retrieval", "#6b8bd6"], ["selection", "stage 1 selection", "#58a37a"],
  ["fusion", "fusion and ranking", "#7fb3c7"], ["prior", "prior (encoder)", "#9aa7b8"],
  ["target", "target (draft)", "#c9a227"], ["lm_pass", "scoring-LM pass", "#d06a2f"],
  ["evidence", "evidence sentences", "#3f9e9e"], ["generation", "generation", "#8b5cc7"],
];
const RANKING_STEPS = ["selection", "prior", "target", "lm_pass"];
const OPTION_CONTROLS = ["scorer", "n", "pool", "target", "estimator"];  // shown only where the method reads them
let options = null;
let shown = { passages: [], estimator: "gate", evidence: [] };

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value || sessionStorage.getItem("gradfuse-api-key");
  if (key) h["X-API-Key"] = key;
  return h;
}

async function api(path, init = {}) {
  const response = await fetch(path, { ...init, headers: headers() });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    if (response.status === 401) $("api-key-label").hidden = false;
    throw new Error(`${response.status}: ${detail}`);
  }
  return response;
}

function fillSelect(select, values, chosen) {
  select.innerHTML = values.map((v) => `<option${v === chosen ? " selected" : ""}>${escapeHtml(v)}</option>`).join("");
}

async function loadOptions() {
  // With a key set, /options needs it too: a 401 shows the key field, and entering a key loads them again.
  $("api-key").value = $("api-key").value || sessionStorage.getItem("gradfuse-api-key") || "";
  options = await (await api("/options")).json();
  const methods = options.methods.filter((m) => !m.startsWith("single:"));
  fillSelect($("method"), methods, options.defaults.method);  // the server's default, as the API and the CLI have it
  fillSelect($("scorer"), options.signals, options.defaults.scorer);
  fillSelect($("pool"), options.pools, options.defaults.pool);
  fillSelect($("target"), options.targets, options.defaults.target);
  fillSelect($("estimator"), options.estimators, options.defaults.estimator);
  $("k").value = options.defaults.context_k;
  $("k").max = options.limits.max_k;
  $("n").value = options.defaults.n;
  $("n").max = options.limits.max_n;
  showControls();
  $("api-key-label").hidden = !options.api_key_required;
  $("error").hidden = true;  // what an earlier key's refusal said is past
  await loadSources();
}

async function loadSources() {
  const box = $("sources");
  try {
    const sources = await (await api("/sources")).json();
    box.innerHTML = "<legend>sources</legend>" + sources.map((s) => {
      const title = s.status === "ok" ? `${s.documents} documents, built ${s.built_at}` : s.error;
      return `<label title="${escapeHtml(title || "")}"><input type="checkbox" name="source" value="${escapeHtml(s.name)}" checked> ${escapeHtml(s.name)}${s.status === "ok" || s.breaker === "open" ? "" : " (unreadable)"}${s.breaker && s.breaker !== "closed" ? ` (breaker ${escapeHtml(s.breaker)})` : ""}</label>`;
    }).join("");
  } catch (error) {
    box.innerHTML = `<legend>sources</legend><span class="note">${escapeHtml(error.message)}</span>`;
  }
}

function readOptions() {
  return options ? options.reads[$("method").value]?.[$("scorer").value] ?? [] : [];
}

function showControls() {
  const read = readOptions();
  for (const name of OPTION_CONTROLS) document.querySelector(`label[data-option=${name}]`).hidden = !read.includes(name);
}

function requestBody() {
  const all = [...document.querySelectorAll("input[name=source]")];
  const chosen = all.filter((c) => c.checked).map((c) => c.value);
  const body = { query: $("question").value, method: $("method").value, k: Number($("k").value), stream: $("stream").checked };
  for (const name of readOptions()) body[name] = name === "n" ? Number($(name).value) : $(name).value;
  if (chosen.length && chosen.length < all.length) body.sources = chosen;
  return body;
}

function reset() {
  $("error").hidden = true;
  for (const id of ["answer-section", "stage1-section", "timings-section", "chart-section", "passages-section"]) $(id).hidden = true;
  $("answer").textContent = "";
  $("citation-note").textContent = "";
  $("failures").innerHTML = "";
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
  $("status").textContent = "";
}

async function ask(event) {
  event.preventDefault();
  if ($("api-key").value) sessionStorage.setItem("gradfuse-api-key", $("api-key").value);
  reset();
  const body = requestBody();
  shown.estimator = body.estimator ?? options.defaults.estimator;
  $("ask").disabled = true;
  $("status").textContent = "retrieving and ranking…";
  try {
    const response = await api("/ask", { method: "POST", body: JSON.stringify(body) });
    if (body.stream) await readEvents(response);
    else showAnswer(await response.json());
  } catch (error) {
    showError(error.message);
  } finally {
    $("ask").disabled = false;
  }
}

async function readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const name = (block.match(/^event: (.*)$/m) || [])[1];
      const data = JSON.parse((block.match(/^data: (.*)$/m) || [])[1] || "null");
      if (name === "search") showSearch(data);
      else if (name === "token") { $("answer").textContent += data.text; $("answer-section").hidden = false; }
      else if (name === "answer") showAnswer(data);
      else if (name === "error") showError(`${data.status}: ${data.detail}`);
    }
  }
}

function showSearch(search) {
  shown.passages = search.candidates;
  $("status").textContent = "generating…";
  showFailures(search.failures);
  showStage1(search);
  showChart(search.candidates, search.method, search.rerank);
  showPassages(search.candidates, []);
  showTimings(search.timings);
}

function showAnswer(answer) {
  shown.passages = answer.passages;
  shown.evidence = answer.evidence || [];
  showFailures(answer.failures);
  showStage1(answer);
  showChart(answer.passages, answer.method, answer.rerank);
  showPassages(answer.passages, answer.citations.map((c) => c.number));
  showTimings(answer.timings);
  $("answer").innerHTML = linkCitations(answer.answer, answer.passages.length);
  $("answer").classList.toggle("not-found", answer.abstained || answer.unsupported);
  $("answer-section").hidden = false;
  const notes = [];
  if (answer.support !== null && answer.support !== undefined) {
    notes.push(answer.abstained ? `The evidence is too weak to answer from (support ${fmt(answer.support, 2)}): the sentences above came closest.`
                                : `Support ${answer.support_at_least ? "≥ " : ""}${fmt(answer.support, 2)}: the chance that these passages hold the answer.`);
  }
  if (!answer.citations.length && !answer.abstained) notes.push("The answer cites no passage.");
  const unbacked = answer.statements.filter((s) => !s.supported).length;
  if (answer.unsupported) notes.push("Unsupported: no sentence of the passages holds what this answer says.");
  else if (unbacked) notes.push(`${unbacked} of ${answer.statements.length} sentences of the answer found no support in the passages.`);
  if (answer.invalid_citations.length) notes.push(`Cited numbers with no passage: ${answer.invalid_citations.join(", ")}.`);
  if (answer.dropped && answer.dropped.length) notes.push(`${answer.dropped.length} lower-ranked passage(s) left out to fit the generator's context window.`);
  notes.push(`Written by ${answer.generator_note}; ranking: ${answer.method}.`);
  $("citation-note").textContent = notes.join(" ");
  $("status").textContent = "";
}

function linkCitations(text, count) {
  // As generate/prompt.py's CITATION_MARKER: a code span, or an index after . ] ) _, is no citation.
  return escapeHtml(text).replace(/(`[^`\n]*`)|(?<![.\])_])\[(\d+(?:\s*,\s*\d+)*)\]/g, (whole, code, numbers) => {
    if (code) return whole;
    const links = numbers.split(",").map((n) => {
      const number = Number(n.trim());
      if (number < 1 || number > count) return String(number);
      return `<a class="citation" href="#passage-${number}" data-n="${number}">${number}</a>`;
    });
    return `[${links.join(", ")}]`;
  });
}

function showFailures(failures) {
  $("failures").innerHTML = failures.map((f) =>
    `<li>source <b>${escapeHtml(f.source)}</b> failed (${escapeHtml(f.reason)}): ${escapeHtml(f.detail)}</li>`).join("");
  if (failures.length) $("answer-section").hidden = false;
}

function fmt(value, digits = 3) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function showStage1(result) {
  const tbody = $("stage1").querySelector("tbody");
  const section = $("stage1-section");
  if (!result.selection) {
    section.hidden = false;
    tbody.innerHTML = `<tr><td colspan="6" class="note">method ${escapeHtml(result.method)} queries every source and does not choose (choose select or gro).</td></tr>`;
    return;
  }
  const rows = result.selection.chosen.map((s) =>
    `<tr class="chosen"><td>✔</td><td>${escapeHtml(s.source)}</td><td class="num">${fmt(s.gain)}</td><td class="num">${fmt(s.relevance)}</td><td class="num">${fmt(s.penalty)}</td><td>chosen</td></tr>`);
  for (const [source, why] of Object.entries(result.selection.dropped)) {
    rows.push(`<tr class="dropped"><td>✘</td><td>${escapeHtml(source)}</td><td></td><td class="num">${fmt(result.selection.relevance[source])}</td><td></td><td>${escapeHtml(why)}</td></tr>`);
  }
  tbody.innerHTML = rows.join("");
  section.hidden = false;
}

function showChart(candidates, method, rerank) {
  // The stage-2 score the method ranked by (rerank:gate, rerank:upr, ...), else the estimator asked for.
  const scoreName = rerank?.score_key ?? `rerank:${shown.estimator}`;
  const scored = candidates.filter((c) => "prior" in c.scores);
  const section = $("chart-section");
  section.hidden = false;
  if (!scored.length) {
    $("chart-note").textContent = `method ${method} computes no prior or stage-2 score (choose dense, gro or a stage-2 method).`;
    $("chart").innerHTML = "";
    return;
  }
  const hasScore = scored.some((c) => scoreName in c.scores);
  $("chart-note").innerHTML = `<span class="swatch" style="background:var(--prior)"></span>prior (the pool's order: cosine to the query or the sources' fusion) ` +
    (hasScore ? `<span class="swatch" style="background:var(--grad)"></span>stage-2 score (${escapeHtml(scoreName)}); bars are scaled to each series' largest magnitude, labels give the raw values.`
                 : `— method ${escapeHtml(method)} makes no scoring-LM pass.`);
  const series = [["prior", "var(--prior)"]].concat(hasScore ? [[scoreName, "var(--grad)"]] : []);
  const scale = Object.fromEntries(series.map(([name]) =>
    [name, Math.max(1e-12, ...scored.map((c) => Math.abs(c.scores[name] ?? 0)))]));
  const row = 18 * series.length + 10, label = 190, half = 230, width = label + 2 * half + 60;
  const mid = label + half;
  let svg = `<svg id="score-chart" width="${width}" height="${row * scored.length + 10}" role="img" aria-label="prior and stage-2 score per document">`;
  svg += `<line x1="${mid}" x2="${mid}" y1="0" y2="${row * scored.length}" stroke="#c4ccd8"/>`;
  scored.forEach((c, i) => {
    const y = i * row + 4;
    const number = candidates.indexOf(c) + 1;
    svg += `<text x="0" y="${y + 13}">[${number}] ${escapeHtml(c.key.slice(0, 26))}</text>`;
    series.forEach(([name, color], j) => {
      const value = c.scores[name];
      if (value === undefined || value === null) return;
      const length = (Math.abs(value) / scale[name]) * half;
      const x = value >= 0 ? mid : mid - length;
      const by = y + j * 18;
      svg += `<rect class="bar" data-series="${escapeHtml(name)}" x="${x}" y="${by}" width="${Math.max(length, 1)}" height="14" fill="${color}"><title>${escapeHtml(name)} ${value}</title></rect>`;
      svg += `<text x="${value >= 0 ? mid + length + 4 : mid - length - 4}" y="${by + 11}" text-anchor="${value >= 0 ? "start" : "end"}">${fmt(value, 4)}</text>`;
    });
  });
  $("chart").innerHTML = svg + "</svg>";
}

function showPassages(passages, cited) {
  $("passages").innerHTML = passages.map((p, i) => {
    const copies = p.merged.map((m) => `${escapeHtml(m.source)}/${escapeHtml(m.doc_id)} @${m.native_rank}`).join(", ");
    const text = escapeHtml((p.title ? p.title + ": " : "") + p.text);
    return `<li id="passage-${i + 1}" class="${cited.includes(i + 1) ? "cited" : ""}">
      ${p.location ? `<div class="location">${escapeHtml(p.location.cited_as)}</div>` : ""}
      <div class="provenance"><b>${escapeHtml(p.source)}</b>/${escapeHtml(p.doc_id)} · rank ${p.native_rank} in source · native score ${fmt(p.native_score)}${copies ? " · also in " + copies : ""}</div>
      <div>${text.length > 400 ? text.slice(0, 400) + "…" : text}</div></li>`;
  }).join("");
  $("passages-section").hidden = false;
}

function showTimings(given) {
  const timings = { ...given };
  if ("ranking" in timings) timings.fusion = Math.max(0, timings.ranking - RANKING_STEPS.reduce((sum, name) => sum + (timings[name] || 0), 0));
  const steps = TIMING_STEPS.filter(([name]) => name in timings);
  const total = steps.reduce((sum, [name]) => sum + timings[name], 0) || 1;
  $("timing-bar").innerHTML = steps.map(([name, label, color]) =>
    `<span style="width:${(100 * timings[name]) / total}%;background:${color}" title="${label}"></span>`).join("");
  const sources = Object.entries(timings).filter(([name]) => name.startsWith("source:"));
  $("timings").querySelector("tbody").innerHTML = steps.map(([name, label, color]) =>
    `<tr><td><span class="swatch" style="background:${color}"></span>${label}</td><td class="num">${(timings[name] * 1000).toFixed(0)} ms</td></tr>`).join("") +
    sources.map(([name, s]) => `<tr class="dropped"><td>&nbsp;&nbsp;${escapeHtml(name)}</td><td class="num">${(s * 1000).toFixed(0)} ms</td></tr>`).join("");
  $("timings-section").hidden = false;
}

function withMarks(text, spans) {
  let html = "", at = 0;
  for (const [start, end] of spans) {
    if (start < at) continue;
    html += escapeHtml(text.slice(at, start)) + `<mark class="evidence">${escapeHtml(text.slice(start, end))}</mark>`;
    at = end;
  }
  return html + escapeHtml(text.slice(at));
}

function openPassage(number) {
  const p = shown.passages[number - 1];
  if (!p) return;
  // A passage read from a file is named by its place in it: "report.pdf · p. 12 · 3.2 Results".
  $("passage-view-title").textContent = `[${number}] ${p.location ? p.location.cited_as : p.title || p.doc_id}`;
  const copies = p.merged.map((m) => `${m.source}/${m.doc_id} (rank ${m.native_rank})`);
  $("passage-view-provenance").textContent =
    `${p.source}/${p.doc_id}, rank ${p.native_rank} in its source` + (copies.length ? `; also in ${copies.join(", ")}` : "") +
    (p.span ? `; characters ${p.span[0]}–${p.span[1]} of ${p.parent_id}` : "");
  // The answer's evidence sentences in this passage, marked where they stand (spans are characters of p.text).
  const spans = shown.evidence.filter((e) => e.passage === number).map((e) => e.span).sort((a, b) => a[0] - b[0]);
  $("passage-view-text").innerHTML = withMarks(p.text, spans);
  $("passage-view-scores").querySelector("tbody").innerHTML = Object.entries(p.scores).map(([name, value]) =>
    `<tr><td>${escapeHtml(name)}</td><td class="num">${fmt(value, 4)}</td></tr>`).join("");
  document.querySelectorAll("#passages li.highlight").forEach((li) => li.classList.remove("highlight"));
  $(`passage-${number}`)?.classList.add("highlight");
  $("passage-view").showModal();
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a.citation");
  if (!link) return;
  event.preventDefault();
  openPassage(Number(link.dataset.n));
});

document.addEventListener("DOMContentLoaded", () => {
  $("ask-form").addEventListener("submit", ask);
  $("method").addEventListener("change", showControls);
  $("scorer").addEventListener("change", showControls);
  $("question").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask-form").requestSubmit(); } });
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("gradfuse-api-key", $("api-key").value);
    loadOptions().catch((error) => showError(`could not load the server's options: ${error.message}`));
  });
  loadOptions().catch((error) => showError(`could not load the server's options: ${error.message}`));
});

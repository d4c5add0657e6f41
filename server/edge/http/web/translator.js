// The translator page: text streamed from /v1/translate:stream, alternatives from /v1/translate,
// glossaries from /v3/glossaries, documents through /v1/files. Every call is the API's own, made
// with the person's key (api.js); every text from the server is inserted as text, never as HTML.
import { ApiError, apiKey, call, callJson, direction, errorOf, languageName, option, wireKeyForm } from "./api.js";

const $ = (id) => document.getElementById(id);
const sourceEl = $("source"), targetEl = $("target"), glossaryEl = $("glossary"), swapEl = $("swap");
const textEl = $("text"), countEl = $("count"), outputEl = $("output"), metaEl = $("meta");
const textError = $("text-error"), alternativesEl = $("alternatives");
const fileEl = $("file"), fileState = $("file-state"), fileProgress = $("file-progress");
const fileError = $("file-error"), downloadEl = $("download");

const state = {
  charLimit: 0,
  pairs: new Map(), // source -> Set of targets
  glossaries: new Map(), // option value -> {id, source, target}
  detected: "", // the language the last translation was detected in
  running: null, // the AbortController of the translation under way
};
const keyForm = wireKeyForm(() => loadModels());

function showError(element, error) {
  element.textContent = error ? error.message || String(error) : "";
  if (error instanceof ApiError && error.auth) keyForm.ask(error.message);
}

// -- languages ------------------------------------------------------------------------------
function targetsOf(source) {
  if (source) return [...(state.pairs.get(source) || [])].sort();
  const all = new Set();
  for (const targets of state.pairs.values()) for (const t of targets) all.add(t);
  return [...all].sort();
}

function fillTargets(prefer) {
  const keep = prefer || targetEl.value;
  targetEl.replaceChildren(...targetsOf(sourceEl.value).map((code) => option(code, languageName(code))));
  if ([...targetEl.options].some((o) => o.value === keep)) targetEl.value = keep;
}

function swapFrom() {
  return sourceEl.value || state.detected;
}

function updateSwap() {
  const from = swapFrom();
  const possible = Boolean(from) && (state.pairs.get(targetEl.value) || new Set()).has(from);
  swapEl.disabled = !possible;
  swapEl.title = possible ? "Swap languages" : "Swap languages: this server has no model for the reverse direction";
}

function chosenGlossary() {
  return state.glossaries.get(glossaryEl.value) || null;
}

function languagesChanged() {
  const glossary = chosenGlossary();
  if (glossary && (glossary.source !== sourceEl.value || glossary.target !== targetEl.value)) glossaryEl.value = "";
  updateSwap();
  remember();
}

async function loadModels() {
  try {
    const listed = await callJson("/v1/models");
    state.pairs = new Map();
    for (const model of listed.models || []) {
      const pairs = model.languagePairs && model.languagePairs.length ? model.languagePairs
        : [{ sourceLanguage: model.sourceLanguage, targetLanguage: model.targetLanguage }];
      for (const pair of pairs) {
        if (!state.pairs.has(pair.sourceLanguage)) state.pairs.set(pair.sourceLanguage, new Set());
        state.pairs.get(pair.sourceLanguage).add(pair.targetLanguage);
      }
    }
  } catch (error) {
    showError(textError, error);
    return;
  }
  showError(textError, null);
  const asked = new URLSearchParams(location.search);
  const sources = [...state.pairs.keys()].sort();
  sourceEl.replaceChildren(option("", "Detect language"), ...sources.map((code) => option(code, languageName(code))));
  const source = asked.get("source");
  if (source && source !== "auto" && state.pairs.has(source)) sourceEl.value = source;
  fillTargets(asked.get("target"));
  updateSwap();
  await loadGlossaries();
  const q = asked.get("q");
  if (q && !textEl.value) {
    textEl.value = q;
    counted();
    translate();
  }
}

async function loadGlossaries() {
  glossaryEl.replaceChildren(option("", "None"));
  state.glossaries = new Map();
  let listed;
  try {
    listed = await callJson("/v3/glossaries");
  } catch {
    return; // no glossaries for this caller: the choice stays "None"
  }
  for (const glossary of listed.glossaries || []) {
    for (const dictionary of glossary.dictionaries || []) {
      const source = String(dictionary.source_lang).toLowerCase(), target = String(dictionary.target_lang).toLowerCase();
      if (!(state.pairs.get(source) || new Set()).has(target)) continue; // no model here for that pair
      const value = `${glossary.glossary_id}:${source}:${target}`;
      state.glossaries.set(value, { id: glossary.glossary_id, source, target });
      glossaryEl.append(option(value, `${glossary.name} (${source} \u2192 ${target}, ${dictionary.entry_count} entries)`));
    }
  }
}

// -- the address: source, target and text, so that a link reproduces a translation -------------
function remember() {
  const params = new URLSearchParams();
  if (sourceEl.value) params.set("source", sourceEl.value);
  if (targetEl.value) params.set("target", targetEl.value);
  if (textEl.value && textEl.value.length <= 2000) params.set("q", textEl.value);
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

// -- text -----------------------------------------------------------------------------------
function length(text) {
  return [...text].length; // characters as the server counts them (code points)
}

function counted() {
  const n = length(textEl.value);
  countEl.textContent = state.charLimit ? `${n} / ${state.charLimit}` : String(n);
  countEl.classList.toggle("over", Boolean(state.charLimit) && n > state.charLimit);
}

function streamRequest() {
  const request = { text: textEl.value, targetLanguage: targetEl.value };
  if (sourceEl.value) request.sourceLanguage = sourceEl.value;
  const glossary = chosenGlossary();
  if (glossary) Object.assign(request, { glossaryId: glossary.id, sourceLanguage: glossary.source });
  return request;
}

// Server-Sent Events from a POST (EventSource only GETs): blocks split at blank lines.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) yield { name, data: JSON.parse(data) };
    }
  }
}

async function translate() {
  if (state.running) state.running.abort();
  showError(textError, null);
  alternativesEl.replaceChildren();
  if (!textEl.value.trim()) {
    outputEl.textContent = "";
    metaEl.textContent = "";
    return;
  }
  if (state.charLimit && length(textEl.value) > state.charLimit) {
    showError(textError, new Error(`The text has ${length(textEl.value)} characters; this server takes at most ${state.charLimit}.`));
    return;
  }
  const running = (state.running = new AbortController());
  const target = targetEl.value;
  outputEl.textContent = "";
  outputEl.lang = target;
  outputEl.dir = direction(target);
  delete outputEl.dataset.done;
  delete outputEl.dataset.firstWordsMs;
  metaEl.textContent = "Translating\u2026";
  remember();
  const started = performance.now();
  let deltas = 0, last = null;
  try {
    const response = await call("/v1/translate:stream", { method: "POST", json: streamRequest(), signal: running.signal });
    if (!response.ok) throw await errorOf(response);
    for await (const event of events(response)) {
      if (event.name === "error") throw new ApiError(event.data.error.code, event.data.error.message);
      if (event.data.delta) {
        outputEl.append(event.data.delta); // a text node: never parsed as HTML
        if (deltas++ === 0) {
          // the first words are on screen at the next frame
          requestAnimationFrame(() => { outputEl.dataset.firstWordsMs = (performance.now() - started).toFixed(1); });
        }
      }
      if (event.data.final) last = event.data;
    }
  } catch (error) {
    if (error.name === "AbortError") return;
    metaEl.textContent = "";
    showError(textError, error);
    return;
  } finally {
    if (state.running === running) state.running = null;
  }
  const seconds = (performance.now() - started) / 1000;
  state.detected = last && last.detectedSourceLanguage ? last.detectedSourceLanguage : "";
  describe(last, seconds);
  outputEl.dataset.deltas = String(deltas);
  outputEl.dataset.done = "1";
  updateSwap();
}

function describe(last, seconds) {
  const parts = [];
  if (last && last.model) parts.push(last.model);
  if (state.detected) {
    const confidence = Number(last.detectionConfidence || 0);
    parts.push(`detected ${languageName(state.detected)} (${Math.round(confidence <= 1 ? confidence * 100 : confidence)}%)`);
  }
  if (last && last.outputTokens) parts.push(`${last.outputTokens} tokens`);
  parts.push(`${Math.round(seconds * 1000)} ms`);
  if (outputEl.dataset.firstWordsMs) parts.push(`first words ${Math.round(Number(outputEl.dataset.firstWordsMs))} ms`);
  metaEl.textContent = parts.join(" \u00b7 ");
}

async function alternatives() {
  showError(textError, null);
  alternativesEl.replaceChildren();
  const selected = textEl.value.slice(textEl.selectionStart, textEl.selectionEnd).trim();
  const piece = selected || textEl.value.trim();
  if (!piece) return;
  const request = { texts: [piece], targetLanguage: targetEl.value, options: { alternatives: 5 } };
  if (sourceEl.value) request.sourceLanguage = sourceEl.value;
  const glossary = chosenGlossary();
  if (glossary) Object.assign(request, { glossaryId: glossary.id, sourceLanguage: glossary.source });
  let found;
  try {
    found = await callJson("/v1/translate", { method: "POST", json: request });
  } catch (error) {
    showError(textError, error);
    return;
  }
  const texts = ((found.translations || [])[0] || { hypotheses: [] }).hypotheses.map((h) => h.text).slice(1);
  if (!texts.length) {
    alternativesEl.append(Object.assign(document.createElement("li"), { textContent: "No other translation." }));
    return;
  }
  for (const text of texts) {
    const item = document.createElement("li");
    const use = document.createElement("button");
    use.type = "button";
    use.textContent = text;
    use.lang = targetEl.value;
    use.dir = direction(targetEl.value);
    use.title = selected ? "Copy this alternative" : "Use this alternative";
    use.addEventListener("click", () => {
      if (selected) copy(text);
      else outputEl.textContent = text;
    });
    item.append(use);
    alternativesEl.append(item);
  }
}

async function copy(text) {
  const button = $("copy");
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Select and copy";
    getSelection().selectAllChildren(outputEl);
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

function swap() {
  const from = swapFrom(), to = targetEl.value;
  if (!from || !(state.pairs.get(to) || new Set()).has(from)) return;
  sourceEl.value = to;
  fillTargets(from);
  glossaryEl.value = "";
  if (outputEl.textContent) {
    textEl.value = outputEl.textContent;
    counted();
  }
  outputEl.textContent = "";
  metaEl.textContent = "";
  state.detected = "";
  updateSwap();
  remember();
  if (textEl.value.trim()) translate();
}

// -- documents ------------------------------------------------------------------------------
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function savedName(response, fallback) {
  const disposition = response.headers.get("content-disposition") || "";
  const utf8 = /filename\*=UTF-8''([^;]+)/i.exec(disposition);
  if (utf8) {
    try {
      return decodeURIComponent(utf8[1]);
    } catch {
      // a malformed escape: the plain name below
    }
  }
  const plain = /filename="([^"]+)"/i.exec(disposition);
  return plain ? plain[1] : fallback;
}

function progressOf(job) {
  fileProgress.hidden = false;
  fileProgress.max = Math.max(1, job.segmentsTotal || 0);
  fileProgress.value = job.segmentsDone || 0;
  if (job.status === "queued") fileState.textContent = `${job.filename}: waiting for a document worker`;
  else if (job.status === "translating") {
    const left = job.secondsRemaining ? `, about ${Math.ceil(job.secondsRemaining)} s left` : "";
    fileState.textContent = `${job.filename}: ${job.segmentsDone || 0} of ${job.segmentsTotal || 0} segments${left}`;
  }
}

async function translateFile(event) {
  event.preventDefault();
  showError(fileError, null);
  fileState.textContent = "";
  downloadEl.hidden = true;
  fileProgress.hidden = true;
  const file = fileEl.files[0];
  if (!file) {
    showError(fileError, new Error("Choose a file to translate first."));
    return;
  }
  const form = new FormData();
  form.append("file", file, file.name);
  form.append("target_language", targetEl.value);
  if (sourceEl.value) form.append("source_language", sourceEl.value);
  try {
    const response = await call("/v1/files", { method: "POST", body: form });
    if (!response.ok) throw await errorOf(response);
    let job = await response.json();
    for (;;) {
      progressOf(job);
      if (job.status === "error") throw new ApiError(400, job.error || "the document could not be translated");
      if (job.status === "done") break;
      await sleep(300);
      job = await callJson(`/v1/files/${encodeURIComponent(job.id)}`);
    }
    const content = await call(`/v1/files/${encodeURIComponent(job.id)}/content`);
    if (!content.ok) throw await errorOf(content);
    const name = savedName(content, job.filename);
    if (downloadEl.href) URL.revokeObjectURL(downloadEl.href);
    downloadEl.href = URL.createObjectURL(await content.blob());
    downloadEl.download = name;
    downloadEl.textContent = `Download ${name}`;
    downloadEl.hidden = false;
    fileState.textContent = `${job.filename}: translated (${job.segmentsTotal} segments, ${job.billedCharacters || 0} characters)`;
    downloadEl.focus();
  } catch (error) {
    fileProgress.hidden = true;
    showError(fileError, error);
  }
}

// -- wiring ---------------------------------------------------------------------------------
async function start() {
  try {
    const settings = await callJson("/frontend/settings"); // LibreTranslate's: limits and formats, no key needed
    state.charLimit = settings.charLimit || 0;
    const formats = settings.supportedFilesFormat || [];
    fileEl.accept = formats.join(",");
    $("formats").textContent = formats.length ? `Formats: ${formats.join(" ")}` : "";
    if (settings.keyRequired && !apiKey()) {
      keyForm.ask("This server needs an API key: enter one to translate.");
      return;
    }
  } catch (error) {
    showError(textError, error);
  }
  counted();
  await loadModels();
}

sourceEl.addEventListener("change", () => { fillTargets(); languagesChanged(); });
targetEl.addEventListener("change", languagesChanged);
glossaryEl.addEventListener("change", () => {
  const glossary = chosenGlossary();
  if (glossary) {
    sourceEl.value = glossary.source;
    fillTargets(glossary.target);
  }
  updateSwap();
  remember();
});
swapEl.addEventListener("click", swap);
textEl.addEventListener("input", counted);
textEl.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    translate();
  }
});
$("translate").addEventListener("click", translate);
$("copy").addEventListener("click", () => copy(outputEl.textContent));
$("more").addEventListener("click", alternatives);
$("file-form").addEventListener("submit", translateFile);
start();

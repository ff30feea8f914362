// lmx chat page: streams /v1/chat/completions (server-sent events) into a conversation, renders
// the answers' markdown with its own small renderer, and shows generated tokens per second.
"use strict";

const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), sendButton = $("send"), stopButton = $("stop");
const history = [];  // {role, content} of the finished turns
let controller = null;

// ---- markdown -------------------------------------------------------------------------------

function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
          .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

// Inline markdown of one escaped-later line: code spans first (their text stays literal), then
// links, bold, italics and strike-through in the rest.
function inline(text) {
  const parts = text.split(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/);
  let out = "";
  for (let i = 0; i < parts.length; i++) {
    if (i % 3 === 0) out += emphasis(parts[i]);
    else if (i % 3 === 2) out += "<code>" + escapeHtml(parts[i].trim() || parts[i]) + "</code>";
  }
  return out;
}

function emphasis(raw) {
  let s = escapeHtml(raw);
  s = s.replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g,
                (m, t, u) => `<a href="${u}" target="_blank" rel="noopener noreferrer">${t}</a>`);
  s = s.replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>");
  s = s.replace(/__([^_]+)__/g, "<strong>$1</strong>");
  s = s.replace(/(^|[^*\w])\*([^*\s][^*]*?)\*(?!\*)/g, "$1<em>$2</em>");
  s = s.replace(/(^|[^_\w])_([^_\s][^_]*?)_(?![_\w])/g, "$1<em>$2</em>");
  s = s.replace(/~~([^~]+)~~/g, "<del>$1</del>");
  return s;
}

function tableRow(line, cell) {
  const cells = line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|");
  return "<tr>" + cells.map((c) => `<${cell}>${inline(c.trim())}</${cell}>`).join("") + "</tr>";
}

// Block markdown: fenced code (an unclosed fence, mid-stream, runs to the end), headings,
// quotes, lists, tables, rules and paragraphs (single newlines kept as line breaks).
function renderMarkdown(src) {
  const lines = src.replace(/\r\n?/g, "\n").split("\n");
  let html = "", para = [], list = null;
  const flushPara = () => {
    if (para.length) html += "<p>" + para.map(inline).join("<br>") + "</p>";
    para = [];
  };
  const flushList = () => {
    if (list) html += `<${list.tag}>` + list.items.map((t) => `<li>${inline(t)}</li>`).join("") +
                      `</${list.tag}>`;
    list = null;
  };
  const flush = () => { flushPara(); flushList(); };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const code = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) code.push(lines[i]);
      const lang = fence[2] ? `<span class="lang">${escapeHtml(fence[2])}</span>` : "";
      html += `<pre>${lang}<code>${escapeHtml(code.join("\n"))}</code></pre>`;
      continue;
    }
    let m;
    if ((m = line.match(/^(#{1,6})\s+(.*)$/))) {
      flush();
      html += `<h${m[1].length}>${inline(m[2])}</h${m[1].length}>`;
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      html += "<hr>";
    } else if ((m = line.match(/^\s*>\s?(.*)$/))) {
      flush();
      const quote = [m[1]];
      while (i + 1 < lines.length && (m = lines[i + 1].match(/^\s*>\s?(.*)$/))) { quote.push(m[1]); i++; }
      html += "<blockquote>" + renderMarkdown(quote.join("\n")) + "</blockquote>";
    } else if ((m = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/))) {
      flushPara();
      const tag = /\d/.test(m[1]) ? "ol" : "ul";
      if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
      list.items.push(m[2]);
    } else if (line.includes("|") && i + 1 < lines.length &&
               /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/.test(lines[i + 1])) {
      flush();
      let t = "<table><thead>" + tableRow(line, "th") + "</thead><tbody>";
      for (i += 2; i < lines.length && lines[i].includes("|"); i++) t += tableRow(lines[i], "td");
      i--;
      html += t + "</tbody></table>";
    } else if (line.trim() === "") {
      flush();
    } else if (list && /^\s{2,}\S/.test(line)) {
      list.items[list.items.length - 1] += " " + line.trim();
    } else {
      flushList();
      para.push(line);
    }
  }
  flush();
  return html;
}

// ---- page ---------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text) { $("status").textContent = text; }

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.innerHTML = `<div class="role">${role}</div>`;
  const body = document.createElement("div");
  body.className = "body";
  if (role === "assistant") body.innerHTML = renderMarkdown(text);
  else body.textContent = text;
  div.appendChild(body);
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return body;
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    const select = $("model");
    select.innerHTML = "";
    for (const m of j.data || []) {
      const o = document.createElement("option");
      o.value = o.textContent = m.id;
      select.appendChild(o);
    }
    setStatus(select.options.length ? "" : "no models: " + JSON.stringify(j));
  } catch (e) {
    setStatus("cannot list models: " + e);
  }
}

// Reads server-sent events from a fetch response, calling onEvent with each data payload.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
                        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") onEvent(JSON.parse(data));
    }
  }
}

async function send(text) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history, { role: "user", content: text });
  addMessage("user", text);
  const body = addMessage("assistant", "");
  body.parentElement.dataset.state = "streaming";
  let content = "", reasoning = "", tokens = 0, first = 0, usage = null;
  const render = () => {
    body.dataset.raw = content;
    body.innerHTML = (reasoning ? `<div class="think">${escapeHtml(reasoning)}</div>` : "") +
                     renderMarkdown(content);
    log.scrollTop = log.scrollHeight;
  };
  controller = new AbortController();
  sendButton.disabled = true;
  stopButton.disabled = false;
  const start = performance.now();
  setStatus("waiting for the first token...");
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({
        model: $("model").value, messages, stream: true, stream_options: { include_usage: true },
        temperature: Number($("temperature").value), max_tokens: Number($("max_tokens").value),
      }),
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || `HTTP ${r.status}`);
    }
    await readEvents(r, (ev) => {
      if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
      if (ev.usage) usage = ev.usage;
      for (const c of ev.choices || []) {
        const d = c.delta || {};
        if (d.content || d.reasoning) {
          if (!first) first = performance.now();
          tokens++;
          content += d.content || "";
          reasoning += d.reasoning || "";
        }
      }
      render();
      const secs = first ? (performance.now() - first) / 1000 : 0;
      if (secs > 0) $("speed").textContent = `${(tokens / secs).toFixed(1)} tokens/s`;
    });
    const n = usage ? usage.completion_tokens : tokens;
    const secs = first ? (performance.now() - first) / 1000 : 0;
    const ttft = first ? ((first - start) / 1000).toFixed(2) : "-";
    if (secs > 0 && n > 1) $("speed").textContent = `${((n - 1) / secs).toFixed(1)} tokens/s`;
    setStatus(`${n} tokens, first after ${ttft} s`);
    body.parentElement.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      setStatus("stopped");
      body.parentElement.dataset.state = "stopped";
    } else {
      addMessage("error", String(e.message || e));
      setStatus("error");
      body.parentElement.dataset.state = "error";
    }
  } finally {
    history.push({ role: "user", content: text });
    if (content) history.push({ role: "assistant", content });
    controller = null;
    sendButton.disabled = false;
    stopButton.disabled = true;
    input.focus();
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("form").requestSubmit();
  }
});
stopButton.addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history.length = 0;
  log.innerHTML = "";
  $("speed").textContent = "";
  setStatus("");
});
$("api_key").addEventListener("change", loadModels);
window.lmxRenderMarkdown = renderMarkdown;  // for tests
loadModels();

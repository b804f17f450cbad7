// The playground page: a chat client for the gateway's OpenAI API, plain JS (no build step).
//
// The API key the user pastes stays in this tab (api.js: sessionStorage and the
// Authorization header of same-origin calls); it never goes into a URL, the page, a log or
// an export. The conversation lives in `state.history` until exported.
//
// Answers are streamed (fetch + ReadableStream, stream_options.include_usage so the last
// event carries the token counts). Stop aborts the fetch (AbortController), which closes the
// connection: the gateway then aborts the request in vLLM and charges what was generated.
import {
  apiError,
  apiFetch,
  clamp,
  describeError,
  measure,
  quotaText,
  serverSentEvents,
  storedKey,
  storeKey,
} from "./api.js";

const IMAGE_TYPES = ["image/jpeg", "image/png", "image/gif", "image/webp"];
// The gateway's default body limit is 32 MiB, and base64 adds a third.
const MAX_IMAGE_BYTES = 5 * 1024 * 1024;
const LIMITS = { maxTokens: [64, 8192], temperature: [0, 1.5], topP: [0.1, 1], topK: [1, 100] };

const $ = (id) => document.getElementById(id);
const ui = {
  key: $("api-key"), connect: $("connect"), forget: $("forget"), quota: $("quota"),
  notice: $("notice"), model: $("model"), modelInfo: $("model-info"), system: $("system"),
  maxTokens: $("max-tokens"), temperature: $("temperature"), topP: $("top-p"),
  topK: $("top-k"), newChat: $("new-chat"), exportButton: $("export"),
  messages: $("messages"), prompt: $("prompt"), image: $("image"),
  attachment: $("attachment"), removeImage: $("remove-image"), stop: $("stop"),
  send: $("send"),
};

const state = {
  key: null, // the API key, in memory while the page is open
  models: new Map(), // id -> max_model_len (null when vLLM does not say)
  history: [], // {role, content, stats?}: the turns sent and answered
  attachment: null, // {name, type, dataUrl} waiting to be sent
  controller: null, // the AbortController of the running answer
};

const api = (path, init) => apiFetch(state.key, path, init);

function showNotice(text) {
  ui.notice.textContent = text;
  ui.notice.hidden = !text;
}

function showQuota(headers) {
  const { text, title } = quotaText(headers);
  ui.quota.textContent = text;
  ui.quota.title = title;
}

// -- key and models -------------------------------------------------------------------------

async function connect() {
  const key = ui.key.value.trim() || state.key;
  if (!key) {
    showNotice("Paste an API key first.");
    return;
  }
  state.key = key;
  storeKey(key);
  ui.key.value = "";
  ui.key.placeholder = "key set (kept in this tab only)";
  showNotice("");
  let response;
  try {
    response = await api("/v1/models");
  } catch (error) {
    showNotice(`The gateway cannot be reached: ${error.message}`);
    return;
  }
  if (!response.ok) {
    if (response.status === 401) forgetKey(); // a refused key is not kept
    showNotice(describeError(await apiError(response)));
    setModels([]);
    return;
  }
  showQuota(response.headers);
  const body = await response.json();
  setModels(Array.isArray(body.data) ? body.data : []);
}

function forgetKey() {
  state.key = null;
  storeKey(null);
  ui.key.value = "";
  ui.key.placeholder = "sk-...";
}

function setModels(cards) {
  const previous = ui.model.value;
  state.models.clear();
  ui.model.replaceChildren();
  for (const card of cards) {
    if (typeof card.id !== "string") continue;
    state.models.set(card.id, Number.isInteger(card.max_model_len) ? card.max_model_len : null);
    ui.model.append(new Option(card.id, card.id));
  }
  if (state.models.has(previous)) ui.model.value = previous;
  setBusy(state.controller !== null);
  modelChanged();
}

function modelChanged() {
  const context = state.models.get(ui.model.value);
  const [low, high] = LIMITS.maxTokens;
  // max_tokens beyond the model's context can never be served: cap the control there.
  ui.maxTokens.max = String(context ? Math.max(low, Math.min(high, context)) : high);
  ui.maxTokens.value = String(clamp(ui.maxTokens.value, low, Number(ui.maxTokens.max)));
  if (!ui.model.value) ui.modelInfo.textContent = "No models: connect with a key.";
  else if (context) ui.modelInfo.textContent = `Context: ${context} tokens (prompt + answer).`;
  else ui.modelInfo.textContent = "Context window not reported.";
}

// -- controls and images --------------------------------------------------------------------

function showControlValues() {
  $("temperature-value").textContent = Number(ui.temperature.value).toFixed(2);
  $("top-p-value").textContent = Number(ui.topP.value).toFixed(2);
  $("top-k-value").textContent = ui.topK.value;
}

function samplingSettings() {
  const highest = Number(ui.maxTokens.max);
  return {
    max_tokens: Math.round(clamp(ui.maxTokens.value, LIMITS.maxTokens[0], highest)),
    temperature: clamp(ui.temperature.value, ...LIMITS.temperature),
    top_p: clamp(ui.topP.value, ...LIMITS.topP),
    top_k: Math.round(clamp(ui.topK.value, ...LIMITS.topK)),
  };
}

function attachImage() {
  const file = ui.image.files && ui.image.files[0];
  ui.image.value = ""; // the same file can be picked again
  if (!file) return;
  if (!IMAGE_TYPES.includes(file.type)) {
    showNotice(`${file.name}: only JPEG, PNG, GIF and WEBP images can be sent.`);
    return;
  }
  if (file.size > MAX_IMAGE_BYTES) {
    showNotice(`${file.name} is larger than ${MAX_IMAGE_BYTES / 1024 / 1024} MiB.`);
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    state.attachment = { name: file.name, type: file.type, dataUrl: String(reader.result) };
    showAttachment();
    showNotice("");
  };
  reader.onerror = () => showNotice(`${file.name} could not be read.`);
  reader.readAsDataURL(file);
}

function showAttachment() {
  ui.attachment.textContent = state.attachment ? `${state.attachment.name} attached` : "";
  ui.removeImage.hidden = !state.attachment;
}

// -- conversation ---------------------------------------------------------------------------

function messageElement(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text; // text, never HTML: answers and messages are not markup
  element.append(label, content);
  ui.messages.append(element);
  return element;
}

function scrollToEnd() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function setBusy(busy) {
  const none = state.models.size === 0;
  ui.send.disabled = busy || none;
  ui.model.disabled = busy || none;
  ui.stop.disabled = !busy;
  ui.newChat.disabled = busy;
}

async function sendMessage() {
  const text = ui.prompt.value.trim();
  if (state.controller || (!text && !state.attachment)) return;
  if (!state.key || !ui.model.value) {
    showNotice("Connect with an API key first.");
    return;
  }
  showNotice("");
  const attachment = state.attachment;
  const content = attachment
    ? [{ type: "text", text }, { type: "image_url", image_url: { url: attachment.dataUrl } }]
    : text;
  const messages = [];
  if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value.trim() });
  for (const turn of state.history) messages.push({ role: turn.role, content: turn.content });
  messages.push({ role: "user", content });
  const body = {
    model: ui.model.value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    ...samplingSettings(),
  };

  const user = messageElement("user", text);
  if (attachment) {
    const image = document.createElement("img");
    image.src = attachment.dataUrl;
    image.alt = attachment.name;
    user.append(image);
  }
  const answer = messageElement("assistant", "");
  answer.dataset.state = "waiting";
  const stats = document.createElement("div");
  stats.className = "stats";
  answer.append(stats);
  ui.prompt.value = "";
  scrollToEnd();

  state.controller = new AbortController();
  setBusy(true);
  const outcome = await streamAnswer(body, answer.querySelector(".content"), answer);
  state.controller = null;
  setBusy(false);

  if (outcome.error || (outcome.stopped && !outcome.text)) {
    // Not answered (an error, or stopped before any text): out of the history, the text back
    // in the box to edit or send again. An answer the model ended at once (EOS as its first
    // token: the tiny model does that) is an answer, empty, not a stop.
    answer.dataset.state = outcome.error ? "error" : "stopped";
    if (outcome.error) {
      answer.querySelector(".content").textContent =
        describeError(outcome.error, { withImage: Boolean(attachment) });
    } else {
      stats.textContent = "Stopped before the answer began";
    }
    user.classList.add("not-sent");
    if (!ui.prompt.value) ui.prompt.value = text;
  } else {
    // A stopped answer stays too: it is what the user saw.
    answer.dataset.state = outcome.stopped ? "stopped" : "done";
    showStats(stats, outcome);
    state.history.push(
      { role: "user", content },
      { role: "assistant", content: outcome.text, stats: outcome.stats },
    );
    if (attachment === state.attachment) {
      state.attachment = null;
      showAttachment();
    }
  }
  scrollToEnd();
}

// Streams one answer into `target`: {text, stats, stopped, chunks} or {error}.
async function streamAnswer(body, target, answer) {
  const started = performance.now();
  let firstTokenAt = null;
  let text = "";
  let chunks = 0;
  let usage = null;
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    showQuota(response.headers);
    if (!response.ok) return { error: await apiError(response) };
    answer.dataset.state = "streaming";
    for await (const events of serverSentEvents(response.body)) {
      let delta = "";
      for (const data of events) {
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) {
          // An error after the stream began arrives as its last event.
          return { error: { status: chunk.error.code || "in-stream", message: chunk.error.message } };
        }
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        const piece = choice && choice.delta ? choice.delta.content : null;
        if (piece) {
          if (firstTokenAt === null) firstTokenAt = performance.now();
          delta += piece;
          chunks += 1;
        }
      }
      if (delta) {
        text += delta;
        target.textContent = text;
        scrollToEnd();
      }
    }
    return { text, chunks, stopped: false, stats: measure(started, firstTokenAt, performance.now(), usage) };
  } catch (error) {
    if (error && error.name === "AbortError") {
      const stats = measure(started, firstTokenAt, performance.now(), null);
      return { text, chunks, stopped: true, stats: { ...stats, stopped: true } };
    }
    return { error: { status: undefined, message: `The request failed: ${error}` } };
  }
}

function showStats(element, outcome) {
  const { stats } = outcome;
  const parts = [];
  if (outcome.stopped) parts.push(`Stopped after ${outcome.chunks} streamed chunks`);
  if (stats.ttft_ms !== null) parts.push(`TTFT ${stats.ttft_ms} ms`);
  if (stats.tokens_per_s !== null) parts.push(`${stats.tokens_per_s} tokens/s`);
  if (stats.total_tokens !== null) {
    parts.push(`tokens: ${stats.prompt_tokens} prompt + ${stats.completion_tokens} ` +
      `completion = ${stats.total_tokens}`);
    element.dataset.promptTokens = String(stats.prompt_tokens);
    element.dataset.completionTokens = String(stats.completion_tokens);
    element.dataset.totalTokens = String(stats.total_tokens);
  } else {
    parts.push("usage is reported only for finished answers");
  }
  element.textContent = parts.join(" · ");
}

function newChat() {
  if (state.controller) return;
  state.history = [];
  ui.messages.replaceChildren();
  showNotice("");
}

function exportConversation() {
  const conversation = {
    exported_at: new Date().toISOString(),
    model: ui.model.value || null,
    system: ui.system.value.trim() || null,
    settings: samplingSettings(),
    messages: state.history,
  };
  const blob = new Blob([JSON.stringify(conversation, null, 2)], { type: "application/json" });
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = `conversation-${conversation.exported_at.replace(/[:.]/g, "-")}.json`;
  document.body.append(link);
  link.click();
  link.remove();
  // The download has its own copy once it started: free the blob on the next turn.
  setTimeout(() => URL.revokeObjectURL(url), 0);
}

// -- wiring ---------------------------------------------------------------------------------

ui.connect.addEventListener("click", connect);
ui.key.addEventListener("keydown", (event) => {
  if (event.key === "Enter") connect();
});
ui.forget.addEventListener("click", () => {
  forgetKey();
  setModels([]);
  ui.quota.textContent = "Quota: paste a key and connect";
  ui.quota.title = "";
});
ui.model.addEventListener("change", modelChanged);
ui.maxTokens.addEventListener("change", modelChanged);
for (const input of [ui.temperature, ui.topP, ui.topK]) {
  input.addEventListener("input", showControlValues);
}
ui.image.addEventListener("change", attachImage);
ui.removeImage.addEventListener("click", () => {
  state.attachment = null;
  showAttachment();
});
ui.send.addEventListener("click", sendMessage);
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendMessage();
  }
});
ui.stop.addEventListener("click", () => {
  if (state.controller) state.controller.abort();
});
ui.newChat.addEventListener("click", newChat);
ui.exportButton.addEventListener("click", exportConversation);

showControlValues();
modelChanged();
state.key = storedKey();
if (state.key) connect();

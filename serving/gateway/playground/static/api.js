// The playground's side of the gateway's API: the key's storage, calls, errors, rate-limit
// headers, server-sent events and answer timings. No DOM here; playground.js draws.

const KEY_STORAGE = "playground.apiKey";

// The key lives in sessionStorage: this tab only, gone when it closes.
export function storedKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE);
  } catch {
    return null; // storage disabled: the key lives in memory only
  }
}

export function storeKey(key) {
  try {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    // storage disabled: memory only
  }
}

// A same-origin API call with the key as its Authorization header: never in the URL, no
// cookies, no referrer, no cached copy.
export function apiFetch(key, path, init = {}) {
  const headers = new Headers(init.headers || {});
  headers.set("Authorization", `Bearer ${key}`);
  return fetch(path, {
    ...init,
    headers,
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  });
}

// The API's own message, and for 429 the wait it asks for.
export async function apiError(response) {
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error && typeof body.error.message === "string") {
      message = body.error.message;
    }
  } catch {
    // not JSON: the status alone
  }
  return { status: response.status, message, retryAfter: retryAfterSeconds(response.headers) };
}

// Whole seconds, rounded up; retry-after-ms (what the OpenAI clients read) is the finer one.
function retryAfterSeconds(headers) {
  const millis = Number.parseFloat(headers.get("retry-after-ms") || "");
  if (Number.isFinite(millis)) return Math.ceil(millis / 1000);
  const seconds = Number.parseFloat(headers.get("retry-after") || "");
  return Number.isFinite(seconds) ? Math.ceil(seconds) : null;
}

export function describeError(error, { withImage = false } = {}) {
  const { status, message } = error;
  if (status === 401) return `Invalid API key (401): ${message}`;
  if (status === 429) {
    const wait = error.retryAfter === null ? "" : ` Retry in ${error.retryAfter} s.`;
    return `Rate limited (429): ${message}${wait}`;
  }
  if (status === 400 && withImage) {
    // /v1/models does not say which models take images (vLLM's model cards have no such
    // field): the page sends the image and reports the server's answer.
    return `The request with an image was refused (400): ${message} ` +
      "This model may not accept images; remove the image or pick a vision model.";
  }
  if (status === undefined) return message;
  return `Error ${status}: ${message}`;
}

// The key's per-minute state from the x-ratelimit-* headers the gateway sends on every API
// response of a key with limits (none for a key without): the text, and when each window is
// full again (OpenAI's duration format, e.g. 1m0.3s) for the tooltip.
export function quotaText(headers) {
  const parts = [];
  const resets = [];
  for (const kind of ["requests", "tokens"]) {
    const limit = headers.get(`x-ratelimit-limit-${kind}`);
    const remaining = headers.get(`x-ratelimit-remaining-${kind}`);
    const reset = headers.get(`x-ratelimit-reset-${kind}`);
    if (limit !== null && remaining !== null) parts.push(`${remaining}/${limit} ${kind}`);
    if (reset !== null) resets.push(`${kind}: all back in ${reset}`);
  }
  return {
    text: parts.length
      ? `Quota left this minute: ${parts.join(" · ")}`
      : "Quota: no per-minute limits reported for this key",
    title: resets.join("; "),
  };
}

export function clamp(value, low, high) {
  const number = Number(value);
  if (!Number.isFinite(number)) return low;
  return Math.min(high, Math.max(low, number));
}

// Server-sent events from a fetch body: yields the data of the events each network read
// completed, so the page redraws once per read rather than once per token.
export async function* serverSentEvents(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      const blocks = buffer.split(/\r\n\r\n|\n\n|\r\r/);
      buffer = blocks.pop();
      const events = [];
      for (const block of blocks) {
        const data = block
          .split(/\r\n|\n|\r/)
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""));
        if (data.length) events.push(data.join("\n"));
      }
      if (events.length) yield events;
    }
  } finally {
    // A caller that stops reading early (an error event) closes the response too; on a
    // finished or aborted stream this does nothing (its rejection is of no interest).
    reader.cancel().catch(() => {});
  }
}

// One answer's numbers: time to first token, decode speed, and the usage vLLM reported.
export function measure(started, firstTokenAt, ended, usage) {
  const result = {
    ttft_ms: firstTokenAt === null ? null : Math.round(firstTokenAt - started),
    tokens_per_s: null,
    prompt_tokens: usage ? usage.prompt_tokens : null,
    completion_tokens: usage ? usage.completion_tokens : null,
    total_tokens: usage ? usage.total_tokens : null,
  };
  // Decode speed: the tokens after the first, over the time after the first.
  if (usage && firstTokenAt !== null && usage.completion_tokens > 1 && ended > firstTokenAt) {
    const seconds = (ended - firstTokenAt) / 1000;
    result.tokens_per_s = Math.round(((usage.completion_tokens - 1) / seconds) * 10) / 10;
  }
  return result;
}

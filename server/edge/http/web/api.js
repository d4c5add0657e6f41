// What both pages share: calls to the server's own API with the person's key, its errors in words,
// and language names. Nothing here builds HTML from text: callers insert text with textContent.

const KEY_ITEM = "nmt-api-key"; // sessionStorage: the key lives as long as the browser tab

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(value) {
  if (value) sessionStorage.setItem(KEY_ITEM, value);
  else sessionStorage.removeItem(KEY_ITEM);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
  get auth() {
    return this.status === 401 || this.status === 403;
  }
}

// fetch() against this server, with `Authorization: Bearer KEY` when a key was given.
export function call(path, { method = "GET", json, body, signal } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers["Authorization"] = "Bearer " + key;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  return fetch(path, { method, headers, body, signal, cache: "no-store" });
}

// The message of an error response in any of the server's shapes: the native API's
// {"error": {"message"}}, LibreTranslate's {"error": "..."}, DeepL's {"message": "..."}.
export async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    const error = body && body.error;
    if (error && typeof error === "object" && error.message) message = error.message;
    else if (typeof error === "string") message = error;
    else if (body && typeof body.message === "string") message = body.message;
  } catch {
    // not JSON: the status line says it
  }
  return new ApiError(response.status, message);
}

// The body of a successful JSON call, or an ApiError.
export async function callJson(path, options) {
  const response = await call(path, options);
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

const names = typeof Intl.DisplayNames === "function" ? new Intl.DisplayNames(["en"], { type: "language" }) : null;

export function languageName(code) {
  if (!code) return "";
  try {
    const name = names ? names.of(code) : "";
    return name && name !== code ? name : code;
  } catch {
    return code;
  }
}

// Languages written right to left (ISO 639-1 and -3 codes), for the direction of translated text.
const RIGHT_TO_LEFT = new Set(["ar", "arc", "ckb", "dv", "fa", "he", "iw", "ks", "ps", "sd", "ug", "ur", "yi"]);

export function direction(code) {
  return RIGHT_TO_LEFT.has(String(code).split(/[-_]/)[0].toLowerCase()) ? "rtl" : "ltr";
}

// The API-key form in the page's header: shown when the server wants a key or refused the one given;
// `onKey()` runs after a key is entered.
export function wireKeyForm(onKey) {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key");
  const note = document.getElementById("key-note");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey(input.value.trim());
    input.value = "";
    form.hidden = true;
    onKey();
  });
  return {
    ask(message) {
      note.textContent = message || "This server needs an API key.";
      form.hidden = false;
      input.focus();
    },
  };
}

export function option(value, label) {
  const element = document.createElement("option");
  element.value = value;
  element.textContent = label;
  return element;
}

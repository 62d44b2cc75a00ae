// The gateway's page: the HTTP API and its event stream (/v1/events), with the operator's
// token as Authorization: Bearer (kept in this tab's sessionStorage only). No build step.
"use strict";

const state = { token: sessionStorage.getItem("idemlink-token") || "", ports: {}, watch: {},
                forbidden: new Set() };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : (c === null || c === undefined ? "" : String(c)));
  return e;
}

async function api(method, path, body) {
  const headers = { "Authorization": "Bearer " + state.token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await r.json();
  if (r.status === 401) setStatus("the token was refused");
  return { status: r.status, body: data };
}

function setStatus(text) { document.getElementById("status").textContent = text; }

function shown(reg) {
  if (reg.value === null || reg.value === undefined) return "?";
  const text = reg.text ?? String(reg.value);
  return reg.label ? `${text} (${reg.label})` : text;
}

function renderPorts() {
  const box = document.getElementById("ports");
  box.replaceChildren();
  for (const p of Object.values(state.ports)) {
    const w = state.watch[p.name] || { registers: {}, load: 0 };
    const dev = p.device || {};
    const card = el("div", { class: "port", id: "port-" + p.name });
    card.append(el("h3", {}, p.name + " ", el("span", { class: p.state, id: "state-" + p.name }, p.state)));
    card.append(el("div", {}, `${p.kind} · map ${p.map} · device ${dev.name || "?"} `
      + `id ${dev.device_id ?? "?"} · epoch ${dev.epoch ?? "?"}`));
    if (p.state !== "up" && p.reason) card.append(el("div", { class: "reason" }, p.reason));
    card.append(el("div", {}, "bus load ",
      el("span", { id: "load-" + p.name }, (100 * (w.load || 0)).toFixed(2)), " %"));
    // a port not up shows the values it last read as such, never as if live
    const live = p.state === "up";
    const t = el("table", {}, el("tr", {}, el("th", {}, "register"),
      el("th", {}, live ? "value" : "last read"), el("th", {}, "unit")));
    for (const reg of Object.values(w.registers)) {
      t.append(el("tr", {}, el("td", {}, reg.name),
        el("td", { class: live ? "num" : "num stale", id: `v-${p.name}-${reg.name}` }, shown(reg)),
        el("td", {}, reg.unit || "")));
    }
    card.append(t);
    box.append(card);
  }
}

function onEvent(type, data) {
  if (type === "snapshot") {
    state.ports = Object.fromEntries(data.ports.map(p => [p.name, p]));
    state.watch = data.watch;
    renderPorts();
    return;
  }
  const w = state.watch[data.port] || (state.watch[data.port] = { registers: {}, load: 0 });
  if (type === "value") {
    w.registers[data.register.name] = data.register;
    const cell = document.getElementById(`v-${data.port}-${data.register.name}`);
    if (!cell) { renderPorts(); return; }
    cell.textContent = shown(data.register);
    cell.classList.add("changed");
    setTimeout(() => cell.classList.remove("changed"), 1500);
  } else if (type === "load") {
    w.load = data.load;
    const span = document.getElementById("load-" + data.port);
    if (span) span.textContent = (100 * data.load).toFixed(2);
  } else if (type === "port") {
    if (state.ports[data.port]) state.ports[data.port].state = data.state;
    refreshPorts();
  }
}

async function refreshPorts() {
  const r = await api("GET", "/v1/ports");
  if (r.status === 200) {
    state.ports = Object.fromEntries(r.body.ports.map(p => [p.name, p]));
    renderPorts();
  }
}

async function stream() {
  // EventSource cannot send a token: the stream is read with fetch, parsed by hand.
  for (;;) {
    let pause = 1000;
    try {
      const r = await fetch("/v1/events", { headers: { "Authorization": "Bearer " + state.token } });
      if (r.status === 401 || r.status === 403) { setStatus("events: HTTP " + r.status); return; }
      if (r.status !== 200) {  // 503: too many streams open; again after its Retry-After
        pause = 1000 * (Number(r.headers.get("Retry-After")) || 5);
        throw new Error("HTTP " + r.status);
      }
      setStatus("live");
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
          let type = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) type = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (data) onEvent(type, JSON.parse(data));
        }
      }
    } catch (e) { setStatus("reconnecting: " + e); }
    await new Promise(ok => setTimeout(ok, pause));
  }
}

// A section the token's role may not read says so (403 FORBIDDEN) instead of staying empty,
// and is not asked again until another token is given: each refusal is an audit entry.
async function section(id, path) {
  if (state.forbidden.has(id)) return null;
  const r = await api("GET", path);
  if (r.status === 403) state.forbidden.add(id);
  document.getElementById(id).textContent =
    r.status === 200 ? "" : `not shown: ${r.body.message || "HTTP " + r.status}`;
  return r.status === 200 ? r : null;
}

async function refreshCalls() {
  const open = await section("open-note", "/v1/open-items");
  if (open) {
    const body = document.querySelector("#open-items tbody");
    body.replaceChildren();
    for (const item of open.body.open_items) {
      const reason = el("input", { type: "text", placeholder: "read back: ...", class: "reason" });
      const button = el("button", { class: "ack", "data-key": item.key, "data-caller": item.caller, title: "needs an admin token" }, "Acknowledge");
      button.addEventListener("click", async () => {
        const why = reason.value.trim() || "checked on the page";
        const q = "?caller=" + encodeURIComponent(item.caller);
        const r = await api("POST", `/v1/open-items/${item.key}/acknowledge${q}`, { reason: why });
        setStatus(r.status === 200 ? `acknowledged ${item.key}` : `refused: ${r.body.message || r.status}`);
        refreshCalls();
      });
      body.append(el("tr", { id: "open-" + item.key }, el("td", {}, item.key), el("td", {}, item.caller),
        el("td", {}, item.port), el("td", {}, `${item.op} ${JSON.stringify(item.args)}`),
        el("td", {}, reason), el("td", {}, button)));
    }
  }
  const recent = await section("recent-note", "/v1/audit?limit=15");
  if (recent) {
    const body = document.querySelector("#recent tbody");
    body.replaceChildren();
    for (const e of recent.body.entries) {
      body.append(el("tr", {}, el("td", {}, new Date(e.at_ms).toLocaleTimeString()),
        el("td", {}, e.caller), el("td", {}, e.method), el("td", {}, `${e.path} ${JSON.stringify(e.content)}`),
        el("td", {}, (e.key || "").slice(0, 13)), el("td", { class: e.outcome }, e.outcome),
        el("td", {}, e.http)));
    }
  }
}

function start() {
  document.getElementById("token").value = state.token;
  document.getElementById("login").addEventListener("submit", ev => {
    ev.preventDefault();
    state.token = document.getElementById("token").value.trim();
    state.forbidden.clear();
    sessionStorage.setItem("idemlink-token", state.token);
    run();
  });
  if (state.token) run();
}

let running = false;
function run() {
  if (running) { refreshCalls(); return; }  // a new token: look again with it now
  running = true;
  stream();
  refreshCalls();
  setInterval(refreshCalls, 2000);
}

document.addEventListener("DOMContentLoaded", start);

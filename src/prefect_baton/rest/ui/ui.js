// The live page of prefect-baton (served at /ui). Every datum comes from the REST API of
// this origin with the bearer key the user signed in with, so the page sees exactly what
// that key sees over REST. No build step, no dependencies.
"use strict";

(function () {
  const KEY = "baton.key";
  const POLL_MS = 2000;
  const TICK_MS = 250;
  const EVENTS_SHOWN = 50;
  const EVENT_PAGES_PER_POLL = 20; // 1,000 events a page
  const INSPECT_MAX = 100; // resources inspected per poll for an agent key
  const LIST_PAGES = 10; // of leases or handoffs, 1,000 a page
  const LIVE = new Set(["lease.acquired", "lease.renewed", "lease.transferred"]);

  const $ = (id) => document.getElementById(id);
  let me = null;
  let lastSeq = 0; // of the event stream
  let skew = 0; // ms to add to this browser's clock to get the server's
  let recent = []; // newest last
  const resources = new Map(); // "type\u0000id" -> kind of its latest lease event
  const sent = new Map(); // handoff id -> true while created by me and unresolved
  let timer = null;
  let sessions = 0;
  let selected = null; // [type, id] of the timeline shown
  let timelineUrl = null;

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path) {
    const key = sessionStorage.getItem(KEY);
    const resp = await fetch(path, {
      headers: { Authorization: "Bearer " + key, Accept: "application/json" },
      cache: "no-store",
    });
    const date = resp.headers.get("Date");
    if (date) {
      // The server's clock (to the second) against this browser's: the countdown follows
      // the server's when the two differ by more than 2 s.
      const off = Date.parse(date) + 500 - Date.now();
      skew = Math.abs(off) > 2000 ? off : 0;
    }
    let body = null;
    try {
      body = await resp.json();
    } catch (_e) {
      body = null;
    }
    if (!resp.ok) {
      const err = (body && body.error) || {};
      throw new ApiError(resp.status, err.code || "HTTP_" + resp.status, err.message || resp.statusText);
    }
    return body.data;
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function fill(tableId, rows, build) {
    const tbody = $(tableId).querySelector("tbody");
    const out = document.createDocumentFragment();
    for (const row of rows) out.appendChild(build(row));
    tbody.replaceChildren(out);
  }

  function when(iso) {
    return iso ? new Date(iso).toLocaleTimeString() : "";
  }

  function resKey(type, id) {
    return type + "\u0000" + id;
  }

  // ---------------------------------------------------------------- sign in / out

  function showSignin(message) {
    stop();
    me = null;
    $("board").hidden = true;
    $("signout").hidden = true;
    $("signin").hidden = false;
    $("who").textContent = "";
    $("status").textContent = "";
    $("signin-error").textContent = message || "";
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    showSignin(message);
  }

  async function signIn() {
    stop();
    try {
      me = await api("/v1/me");
    } catch (e) {
      signOut(e.status === 401 ? "That key was refused (unknown or revoked)." : e.message);
      return;
    }
    lastSeq = 0;
    recent = [];
    resources.clear();
    sent.clear();
    $("who").textContent = me.principal + " (" + me.role + ") in " + me.org;
    $("signin").hidden = true;
    $("board").hidden = false;
    $("signout").hidden = false;
    const session = ++sessions;
    const loop = async () => {
      await refresh();
      if (session === sessions && me !== null) timer = setTimeout(loop, POLL_MS);
    };
    await loop();
  }

  // Polls run one after another (never two at once); a new sign-in or a sign-out ends
  // the loop of the previous one.
  function stop() {
    sessions++;
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  // ---------------------------------------------------------------- reading the API

  // The event stream is read from where the last poll stopped (seq > lastSeq), at most
  // EVENT_PAGES_PER_POLL pages a poll; the newest EVENTS_SHOWN are kept for the table.
  async function readEvents() {
    const session = sessions;
    for (let i = 0; i < EVENT_PAGES_PER_POLL; i++) {
      const page = await api("/v1/events?limit=1000&after=" + lastSeq);
      if (session !== sessions) return undefined; // another key's page by now
      for (const ev of page.events) {
        const p = ev.payload || {};
        if (ev.kind.startsWith("lease.") && p.resource_type !== undefined) {
          const k = resKey(p.resource_type, p.resource_id);
          resources.delete(k); // kept in the order of their latest lease event
          resources.set(k, ev.kind);
        } else if (ev.kind === "handoff.created" && p.from_principal === me.principal) {
          sent.set(p.handoff_id, true);
        } else if (ev.kind === "handoff.accepted" || ev.kind === "handoff.rejected") {
          sent.delete(p.handoff_id);
        }
        recent.push(ev);
        lastSeq = ev.seq;
      }
      if (recent.length > EVENTS_SHOWN) recent = recent.slice(-EVENTS_SHOWN);
      if (!page.next_cursor) break;
    }
    return true;
  }

  // An owner or admin key sees every principal's leases and pending handoffs of the org
  // (the REST API's rule); other keys see their own.
  const sees_everything = () => me.role === "owner" || me.role === "admin";

  // Every item of a paged list (`query` ends with its own filters), 1,000 a page, at most
  // LIST_PAGES pages.
  async function readAll(path, query, field) {
    const listed = [];
    let next = null;
    for (let i = 0; i < LIST_PAGES; i++) {
      const page = await api(path + "?limit=1000" + query + (next ? "&cursor=" + encodeURIComponent(next) : ""));
      listed.push(...page[field]);
      next = page.next_cursor;
      if (!next) break;
    }
    return listed;
  }

  async function readLeases() {
    const full = sees_everything();
    const listed = await readAll("/v1/leases", full ? "&owner=*" : "", "leases");
    const rows = listed.map((l) => ({
      type: l.resource_type,
      id: l.resource_id,
      epoch: l.epoch,
      expires: l.expires_at,
      holder: l.owner,
      purpose: l.purpose,
      scopes: l.scopes,
      visible: true,
    }));
    if (full) return rows;
    // An agent key lists its own leases; the others of the org are found in the event
    // stream and read through inspect, which never shows their holder, purpose or scopes.
    const own = new Set(rows.map((r) => resKey(r.type, r.id)));
    const others = [];
    for (const [k, kind] of resources) {
      if (LIVE.has(kind) && !own.has(k)) others.push(k);
    }
    const infos = await Promise.all(
      others.slice(-INSPECT_MAX).map((k) => {
        const [type, id] = k.split("\u0000");
        const q = "resource_type=" + encodeURIComponent(type) + "&resource_id=" + encodeURIComponent(id);
        return api("/v1/leases/inspect?" + q);
      }),
    );
    for (const info of infos) {
      if (!info.held) continue;
      const l = info.lease;
      rows.push({
        type: info.resource_type,
        id: info.resource_id,
        epoch: info.epoch,
        expires: info.expires_at,
        holder: l ? l.owner : null,
        purpose: l ? l.purpose : null,
        scopes: l ? l.scopes : null,
        visible: Boolean(l),
      });
    }
    return rows;
  }

  // An owner or admin: every pending handoff of the org (GET /v1/handoffs?party=*). Others:
  // the inbox, and the handoffs this key sent (found in the event stream) while pending.
  async function readHandoffs() {
    if (sees_everything()) return readAll("/v1/handoffs", "&party=*", "handoffs");
    const inbox = (await api("/v1/handoffs?limit=1000")).handoffs;
    const seen = new Set(inbox.map((h) => h.handoff_id));
    const mine = await Promise.all(
      [...sent.keys()].filter((id) => !seen.has(id)).map((id) =>
        api("/v1/handoffs/" + encodeURIComponent(id)).catch(() => null),
      ),
    );
    for (const h of mine) {
      if (h && h.status === "pending") inbox.push(h);
      else if (h) sent.delete(h.handoff_id);
    }
    return inbox;
  }

  // One section that fails (a key without a scope, say) leaves the others updating; a
  // refused key (401) signs the page out.
  async function refresh() {
    const session = sessions;
    const failed = [];
    const attempt = async (what, read) => {
      try {
        const value = await read();
        // a sign-out or a new sign-in while this ran: its answer is of no use
        return session === sessions ? value : undefined;
      } catch (e) {
        if (session !== sessions) return undefined;
        if (e.status === 401) throw e;
        failed.push(what + ": " + e.message);
        return undefined;
      }
    };
    try {
      if ((await attempt("events", readEvents)) !== undefined) renderEvents();
      const [leases, handoffs, lag] = await Promise.all([
        attempt("leases", readLeases),
        attempt("handoffs", readHandoffs),
        attempt("lag", () => api("/v1/reconciler/lag")),
      ]);
      if (leases !== undefined) renderLeases(leases);
      if (handoffs !== undefined) renderHandoffs(handoffs);
      if (lag !== undefined) renderLag(lag);
      tick();
    } catch (e) {
      signOut("The key stopped working (revoked?). Sign in again.");
      return;
    }
    if (session !== sessions) return;
    const status = $("status");
    status.textContent = failed.length
      ? "update failed: " + failed.join("; ")
      : "updated " + new Date().toLocaleTimeString();
    status.classList.toggle("error", failed.length > 0);
  }

  // ---------------------------------------------------------------- rendering

  function renderLeases(rows) {
    rows.sort((a, b) => (a.type + "/" + a.id).localeCompare(b.type + "/" + b.id));
    $("lease-count").textContent = "(" + rows.length + ")";
    fill("leases", rows, (r) => {
      const tr = document.createElement("tr");
      tr.dataset.resource = r.type + "/" + r.id;
      tr.dataset.type = r.type;
      tr.dataset.id = r.id;
      if (selected && selected[0] === r.type && selected[1] === r.id) tr.className = "selected";
      cell(tr, r.type + "/" + r.id);
      cell(tr, r.epoch, "num epoch");
      const exp = cell(tr, "", "num expires");
      exp.dataset.expires = String(Date.parse(r.expires));
      if (r.visible) {
        cell(tr, r.holder, "holder");
        cell(tr, r.purpose, "purpose");
        cell(tr, (r.scopes || []).join(", "), "scopes");
      } else {
        cell(tr, "hidden", "holder redacted");
        cell(tr, "hidden", "purpose redacted");
        cell(tr, "hidden", "scopes redacted");
      }
      return tr;
    });
  }

  function renderHandoffs(rows) {
    $("handoff-count").textContent = "(" + rows.length + ")";
    fill("handoffs", rows, (h) => {
      const tr = document.createElement("tr");
      tr.dataset.handoff = h.handoff_id;
      cell(tr, h.handoff_id);
      cell(tr, h.from_principal);
      cell(tr, h.to_principal);
      cell(tr, h.subject_id);
      cell(tr, when(h.created_at));
      cell(tr, h.message);
      return tr;
    });
  }

  function renderLag(lag) {
    $("lag").textContent =
      lag.authority === "ledger"
        ? "none: the ledger is the lease authority"
        : lag.entries + " journal entries, oldest " + lag.seconds.toFixed(1) + " s";
  }

  function renderEvents() {
    fill("events", recent.slice().reverse(), (ev) => {
      const tr = document.createElement("tr");
      tr.dataset.kind = ev.kind;
      cell(tr, ev.seq, "num");
      cell(tr, when(ev.occurred_at));
      cell(tr, ev.kind);
      cell(tr, ev.principal);
      cell(tr, ev.subject);
      return tr;
    });
  }

  // The expiry column counts down between polls.
  function tick() {
    const now = Date.now() + skew;
    for (const td of document.querySelectorAll("#leases td.expires")) {
      const left = (Number(td.dataset.expires) - now) / 1000;
      if (left > 0) {
        td.textContent = left.toFixed(1) + " s";
        td.classList.remove("expired");
      } else {
        td.textContent = "expired";
        td.classList.add("expired");
      }
    }
  }

  // ---------------------------------------------------------------- timeline

  async function showTimeline(type, id) {
    selected = [type, id];
    $("timeline").hidden = false;
    $("timeline-resource").textContent = type + "/" + id;
    $("timeline-error").textContent = "";
    const key = sessionStorage.getItem(KEY);
    const path =
      "/v1/resources/timeline.svg?resource_type=" + encodeURIComponent(type) + "&resource_id=" + encodeURIComponent(id);
    try {
      const resp = await fetch(path, { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
      if (!resp.ok) {
        const body = await resp.json().catch(() => null);
        throw new Error((body && body.error && body.error.message) || resp.statusText);
      }
      const blob = await resp.blob();
      if (timelineUrl) URL.revokeObjectURL(timelineUrl);
      timelineUrl = URL.createObjectURL(blob);
      $("timeline-img").src = timelineUrl;
    } catch (e) {
      $("timeline-img").removeAttribute("src");
      $("timeline-error").textContent = "no timeline: " + e.message;
    }
  }

  function hideTimeline() {
    selected = null;
    $("timeline").hidden = true;
    for (const tr of document.querySelectorAll("#leases tr.selected")) tr.classList.remove("selected");
  }

  // ---------------------------------------------------------------- start

  document.addEventListener("DOMContentLoaded", () => {
    // A key handed over in the URL's fragment (baton ui --open) never reaches a server:
    // take it into session storage and drop it from the address bar.
    const m = /(?:^#|&)key=([^&]+)/.exec(location.hash);
    if (m) {
      try {
        sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
      } catch (_err) {
        // a malformed fragment: ignored (the sign-in form still works)
      }
      history.replaceState(null, "", location.pathname + location.search);
    }
    $("signin-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, $("key").value.trim());
      $("key").value = "";
      signIn();
    });
    $("signout").addEventListener("click", () => signOut(""));
    $("timeline-close").addEventListener("click", hideTimeline);
    $("leases").querySelector("tbody").addEventListener("click", (ev) => {
      const tr = ev.target.closest("tr");
      if (tr) showTimeline(tr.dataset.type, tr.dataset.id);
    });
    setInterval(tick, TICK_MS);
    if (sessionStorage.getItem(KEY)) signIn();
    else showSignin("");
  });
})();

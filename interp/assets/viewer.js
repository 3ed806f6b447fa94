// Attention viewer: no dependencies, no network. One call per viewer: interpAttentionViewer(root), where root
// holds the controls and a <script class="av-data"> with the payload of interp.viewer.ViewerData.
// Every element is found under root (classes, not ids), so any number of viewers share a page.
window.interpAttentionViewer = window.interpAttentionViewer || function (root) {
  "use strict";
  if (!root || root.dataset.ready) { return; }
  root.dataset.ready = "1";
  var data = JSON.parse(root.querySelector(".av-data").textContent);
  var blocks = data.patterns.map(function (b64) {
    var raw = atob(b64), bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    return bytes;
  });
  var state = { prompt: 0, head: data.open || 0, query: 0 };
  function find(cls) { return root.querySelector("." + cls); }
  var promptSel = find("av-prompt"), headSel = find("av-head"), overview = find("av-overview");
  var tokensBox = find("av-tokens"), status = find("av-status"), grid = find("av-grid"), tip = find("av-tip");
  var cells = [];  // cells[q][k]: the grid's elements for the current prompt

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function option(sel, value, text) { var o = el("option", "", text); o.value = value; sel.appendChild(o); }
  data.tokens.forEach(function (toks, i) {
    option(promptSel, i, "prompt " + (i + 1) + ": " + toks.slice(0, 8).join(" ") + (toks.length > 8 ? " ..." : ""));
  });
  data.heads.forEach(function (label, i) { option(headSel, i, label); });

  function n() { return data.tokens[state.prompt].length; }
  function weight(h, q, k) {  // head h's weight from query q to key k on the current prompt, in [0, 1]
    var len = n();
    return blocks[state.prompt][(h * len + q) * len + k] / data.levels;
  }
  function blue(w) { return "rgba(31, 119, 180, " + Math.min(1, w).toFixed(3) + ")"; }

  // ---- overview: every head's pattern as a small canvas, one row per layer; click to open it
  function drawOverview() {
    overview.textContent = "";
    var rows = {}, len = n();
    data.heads.forEach(function (label, h) {
      var layer = data.positions.length ? data.positions[h][0] : 0;
      if (!rows[layer]) {
        rows[layer] = el("div", "av-row");
        rows[layer].appendChild(el("span", "av-row-label", "L" + layer));
        overview.appendChild(rows[layer]);
      }
      var button = el("button", "av-thumb"), canvas = el("canvas");
      button.type = "button"; button.title = label; button.dataset.head = h;
      canvas.width = len; canvas.height = len;
      var ctx = canvas.getContext("2d"), img = ctx.createImageData(len, len);
      for (var q = 0; q < len; q++) {
        for (var k = 0; k < len; k++) {
          var w = weight(h, q, k), o = 4 * (q * len + k);
          img.data[o] = Math.round(255 - 224 * w); img.data[o + 1] = Math.round(255 - 136 * w);
          img.data[o + 2] = Math.round(255 - 75 * w); img.data[o + 3] = 255;
        }
      }
      ctx.putImageData(img, 0, 0);
      button.appendChild(canvas); button.appendChild(el("span", "av-thumb-label", label));
      button.addEventListener("click", function () { setHead(h); });
      rows[layer].appendChild(button);
    });
  }

  // ---- the chosen head's grid: key tokens across the top, query tokens down the side
  function buildGrid() {
    var toks = data.tokens[state.prompt], len = toks.length;
    grid.textContent = ""; cells = [];
    grid.style.gridTemplateColumns = "auto repeat(" + len + ", 14px)"; grid.style.gridTemplateRows = "auto";
    grid.appendChild(el("span", "av-corner", "query \\ key"));
    toks.forEach(function (t) { grid.appendChild(el("span", "av-key", t)); });
    toks.forEach(function (t, q) {
      grid.appendChild(el("span", "av-qlabel", t));
      cells.push(toks.map(function (_, k) {
        var c = el("span", "av-cell"); c.dataset.q = q; c.dataset.k = k; grid.appendChild(c); return c;
      }));
    });
  }
  function shadeGrid() {
    cells.forEach(function (row, q) {
      row.forEach(function (c, k) {
        var w = weight(state.head, q, k);
        c.dataset.w = w.toFixed(3); c.style.background = blue(w);
        c.classList.toggle("av-qrow", q === state.query);
      });
    });
  }
  grid.addEventListener("mouseover", function (event) {
    var c = event.target;
    if (!c.classList.contains("av-cell")) { return; }
    var toks = data.tokens[state.prompt], q = Number(c.dataset.q), k = Number(c.dataset.k);
    tip.textContent = data.heads[state.head] + ": query " + q + " \u201c" + toks[q] + "\u201d \u2192 key " + k +
      " \u201c" + toks[k] + "\u201d: " + weight(state.head, q, k).toFixed(3);
    tip.hidden = false;
    tip.style.left = (c.offsetLeft + 18) + "px"; tip.style.top = (c.offsetTop + 18) + "px";
    if (q !== state.query) { setQuery(q); }
  });
  grid.addEventListener("mouseleave", function () { tip.hidden = true; });

  // ---- clicking a cell: the source pairs behind the query's preference for that key (data.qk, when embedded)
  var qkBox = find("av-qk");
  if (data.qk && Object.keys(data.qk.heads || {}).length) {
    find("av-help").textContent += "; click a cell of " + Object.keys(data.qk.heads).join(", ") +
      ": the source pairs behind it";
  }
  function showPairs(q, k) {
    var toks = data.tokens[state.prompt], label = data.heads[state.head];
    var heads = (data.qk && data.qk.heads) || {}, entry = heads[label];
    qkBox.textContent = ""; qkBox.hidden = false;
    if (!entry) {
      var named = Object.keys(heads);
      qkBox.appendChild(el("p", "av-qk-note", named.length ?
        "Source pairs are embedded for " + named.join(", ") + " only; `interp qk --head " + label + "` attributes any head." :
        "No source pairs are embedded in this view; `interp qk --head " + label + "` attributes a head's scores."));
      return;
    }
    var cell = entry.cells[state.prompt][q + "," + k];
    if (!cell) {
      qkBox.appendChild(el("p", "av-qk-note", label + ", query " + q + " \u2192 key " + k + ": source pairs are " +
        "embedded for each query's highest-attention key only (and no query sees a single key); " +
        "`interp qk --head " + label + " --query Q --key K` attributes any cell."));
      return;
    }
    var against = cell[0];
    qkBox.appendChild(el("p", "av-qk-title", label + ", query " + q + " \u201c" + toks[q] + "\u201d prefers key " + k +
      " \u201c" + toks[k] + "\u201d to key " + against + " \u201c" + toks[against] + "\u201d by " + cell[1].toFixed(3) +
      " (s(q, k) \u2212 s(q, k\u2032) = log p_k \u2212 log p_k\u2032); its " + ((cell.length - 2) / 3) +
      " largest source pairs:"));
    var table = el("table", "av-qk-pairs"), head = el("tr");
    ["query source", "key source", "term"].forEach(function (t) { head.appendChild(el("th", "", t)); });
    table.appendChild(head);
    for (var i = 2; i + 2 < cell.length; i += 3) {
      var row = el("tr");
      row.appendChild(el("td", "", entry.query_sources[cell[i]]));
      row.appendChild(el("td", "", entry.key_sources[cell[i + 1]]));
      row.appendChild(el("td", "av-num", cell[i + 2].toFixed(3)));
      table.appendChild(row);
    }
    qkBox.appendChild(table);
  }
  grid.addEventListener("click", function (event) {
    var c = event.target;
    if (c.classList.contains("av-cell")) { showPairs(Number(c.dataset.q), Number(c.dataset.k)); }
  });

  // ---- the tokens, shaded by the query's weights
  function drawTokens() {
    tokensBox.textContent = "";
    data.tokens[state.prompt].forEach(function (text, k) {
      var span = el("span", "av-tok");
      span.dataset.index = k; span.tabIndex = -1;
      span.appendChild(el("span", "", text)); span.appendChild(el("span", "av-w"));
      span.addEventListener("mouseenter", function () { setQuery(k); });
      span.addEventListener("focus", function () { setQuery(k); });
      tokensBox.appendChild(span);
    });
  }
  function shadeTokens() {
    var toks = data.tokens[state.prompt], q = state.query, h = state.head, best = 0;
    tokensBox.querySelectorAll(".av-tok").forEach(function (span, k) {
      var w = weight(h, q, k);
      if (w > weight(h, q, best)) { best = k; }
      span.dataset.w = w.toFixed(3);
      span.style.background = blue(w);
      span.style.color = w > 0.55 ? "#fff" : "#222";
      span.querySelector(".av-w").textContent = w >= 0.005 ? w.toFixed(2) : "";
      span.classList.toggle("av-query", k === q);
      span.classList.toggle("av-future", data.causal && k > q);
    });
    status.textContent = data.heads[h] + ", query " + q + " \u201c" + toks[q] + "\u201d: strongest key " + best +
      " \u201c" + toks[best] + "\u201d (" + weight(h, q, best).toFixed(2) + ")";
  }

  function redraw() {
    overview.querySelectorAll(".av-thumb").forEach(function (b) {
      b.classList.toggle("av-open", Number(b.dataset.head) === state.head);
    });
    shadeTokens(); shadeGrid();
  }
  function setQuery(q) { state.query = Math.max(0, Math.min(n() - 1, q)); redraw(); }
  function setHead(h) {
    var count = data.heads.length;
    state.head = ((h % count) + count) % count; headSel.value = state.head; qkBox.hidden = true; redraw();
  }
  function setPrompt(p) {
    state.prompt = p; qkBox.hidden = true; state.query = Math.min(state.query, n() - 1);
    drawOverview(); buildGrid(); drawTokens(); redraw();
  }

  promptSel.addEventListener("change", function () { setPrompt(Number(promptSel.value)); });
  headSel.addEventListener("change", function () { setHead(Number(headSel.value)); });
  // the keys work as soon as the pointer is over the viewer, without a click first
  root.addEventListener("mouseenter", function () {
    if (document.activeElement === document.body) { root.focus({ preventScroll: true }); }
  });
  root.addEventListener("keydown", function (event) {
    var moves = { j: 1, ArrowDown: 1, k: -1, ArrowUp: -1 };
    if (event.target.tagName === "SELECT") { return; }
    if (event.key in moves) { setHead(state.head + moves[event.key]); event.preventDefault(); }
    else if (event.key === "ArrowLeft") { setQuery(state.query - 1); event.preventDefault(); }
    else if (event.key === "ArrowRight") { setQuery(state.query + 1); event.preventDefault(); }
  });
  headSel.value = state.head;
  setPrompt(0);
  setQuery(n() - 1);
};

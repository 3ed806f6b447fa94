// Attention viewer for report.html: no dependencies, no network. Data: #av-data (see analyses/viewer.py).
(function () {
  "use strict";
  var node = document.getElementById("av-data");
  if (!node) { return; }
  var data = JSON.parse(node.textContent);
  var blocks = data.patterns.map(function (b64) {
    var raw = atob(b64), bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    return bytes;
  });
  var state = { prompt: 0, head: 0, query: 0 };
  var promptSel = document.getElementById("av-prompt"), headSel = document.getElementById("av-head");
  var tokensBox = document.getElementById("av-tokens"), status = document.getElementById("av-status");
  var grid = document.getElementById("av-grid");

  function option(sel, value, text) {
    var o = document.createElement("option"); o.value = value; o.textContent = text; sel.appendChild(o);
  }
  data.tokens.forEach(function (toks, i) {
    option(promptSel, i, "prompt " + (i + 1) + ": " + toks.slice(0, 8).join(" ") + (toks.length > 8 ? " ..." : ""));
  });
  data.heads.forEach(function (label, i) { option(headSel, i, label); });

  function n() { return data.tokens[state.prompt].length; }
  function weight(q, k) {  // the chosen head's weight from query q to key k, in [0, 1]
    var len = n();
    return blocks[state.prompt][(state.head * len + q) * len + k] / data.levels;
  }

  function drawTokens() {
    tokensBox.textContent = "";
    data.tokens[state.prompt].forEach(function (text, k) {
      var span = document.createElement("span"), label = document.createElement("span"), w = document.createElement("span");
      span.className = "av-tok"; span.dataset.index = k; span.tabIndex = -1;
      label.textContent = text; w.className = "av-w";
      span.appendChild(label); span.appendChild(w);
      span.addEventListener("mouseenter", function () { setQuery(k); });
      span.addEventListener("focus", function () { setQuery(k); });
      tokensBox.appendChild(span);
    });
  }

  function shade() {
    var toks = data.tokens[state.prompt], q = state.query, best = 0;
    tokensBox.querySelectorAll(".av-tok").forEach(function (span, k) {
      var w = weight(q, k);
      if (w > weight(q, best)) { best = k; }
      span.dataset.w = w.toFixed(3);
      span.style.background = "rgba(31, 119, 180, " + Math.min(1, w).toFixed(3) + ")";
      span.style.color = w > 0.55 ? "#fff" : "#222";
      span.querySelector(".av-w").textContent = w >= 0.005 ? w.toFixed(2) : "";
      span.classList.toggle("av-query", k === q);
      span.classList.toggle("av-future", data.causal && k > q);
    });
    status.textContent = data.heads[state.head] + ", query " + q + " \u201c" + toks[q] + "\u201d: strongest key " + best +
      " \u201c" + toks[best] + "\u201d (" + weight(q, best).toFixed(2) + ")";
    drawGrid();
  }

  function drawGrid() {
    var len = n(), ctx = grid.getContext("2d"), img = ctx.createImageData(len, len);
    grid.width = len; grid.height = len;
    for (var q = 0; q < len; q++) {
      for (var k = 0; k < len; k++) {
        var w = weight(q, k), o = 4 * (q * len + k), hi = q === state.query;
        img.data[o] = hi ? 214 : Math.round(255 - 224 * w);
        img.data[o + 1] = hi ? Math.round(255 - 216 * w) : Math.round(255 - 136 * w);
        img.data[o + 2] = hi ? Math.round(255 - 215 * w) : Math.round(255 - 75 * w);
        img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  function setQuery(q) { state.query = Math.max(0, Math.min(n() - 1, q)); shade(); }
  function setHead(h) {
    var count = data.heads.length;
    state.head = ((h % count) + count) % count; headSel.value = state.head; shade();
  }
  function setPrompt(p) { state.prompt = p; state.query = Math.min(state.query, n() - 1); drawTokens(); shade(); }

  promptSel.addEventListener("change", function () { setPrompt(Number(promptSel.value)); });
  headSel.addEventListener("change", function () { setHead(Number(headSel.value)); });
  var viewer = document.getElementById("attn-viewer");
  // the keys work as soon as the pointer is over the viewer, without a click first
  viewer.addEventListener("mouseenter", function () {
    if (document.activeElement === document.body) { viewer.focus({ preventScroll: true }); }
  });
  viewer.addEventListener("keydown", function (event) {
    var moves = { j: 1, ArrowDown: 1, k: -1, ArrowUp: -1 };
    if (event.target.tagName === "SELECT") { return; }
    if (event.key in moves) { setHead(state.head + moves[event.key]); event.preventDefault(); }
    else if (event.key === "ArrowLeft") { setQuery(state.query - 1); event.preventDefault(); }
    else if (event.key === "ArrowRight") { setQuery(state.query + 1); event.preventDefault(); }
  });
  setPrompt(0);
  setQuery(n() - 1);
})();

// Charts on a canvas, shared by the training page (www/main.js) and the run report
// (`alpha-native report`, which inlines this file): line charts of one or more series, with
// a legend and an optional log scale, and stacked bars. No library: the page and the report
// open from disk, with no network. Each chart records what it drew on its canvas
// (data-points, data-series) for the browser tests.

/** Colours of successive series. */
export const PALETTE = ["#3366cc", "#dc6b19", "#2a9d5c", "#a23b72", "#7a6c00", "#0b7a8a", "#8c564b", "#555"];

const PAD = { left: 52, right: 12, top: 22, bottom: 30 };

/** A round number of the axis' scale for labels. */
function label(v) {
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e5 || a < 1e-3) return v.toExponential(1);
  return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toPrecision(3);
}

/**
 * Draws `series` ([{ name, color?, points: [[x, y], ...], dots? }]) on `canvas`: lines (or dots
 * with `dots`), x from 0 (or `xMin`) to the largest x (or `xMax`), y over the points' range (or
 * on a log scale with `logY`, positive values only). Non-finite points are left out.
 */
export function lineChart(canvas, { series, xMin = 0, xMax, xLabel = "", yLabel = "", logY = false, title = "" }) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const keep = ([x, y]) => Number.isFinite(x) && Number.isFinite(y) && (!logY || y > 0);
  const drawn = series.map((s, i) => ({ ...s, color: s.color ?? PALETTE[i % PALETTE.length], points: s.points.filter(keep) }));
  const all = drawn.flatMap((s) => s.points);
  canvas.dataset.points = String(all.length);
  canvas.dataset.series = String(drawn.filter((s) => s.points.length > 0).length);
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = "#223";
  if (title) ctx.fillText(title, PAD.left, 14);
  if (all.length === 0) {
    ctx.fillStyle = "#889";
    ctx.fillText("no data", width / 2 - 20, height / 2);
    return;
  }
  const f = logY ? Math.log10 : (v) => v;
  const ys = all.map(([, y]) => f(y));
  let lo = Math.min(...ys);
  let hi = Math.max(...ys);
  if (hi - lo < 1e-9) [lo, hi] = [lo - 0.5, hi + 0.5];
  const x1 = xMax ?? Math.max(...all.map(([x]) => x), xMin + 1);
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const px = (x) => PAD.left + (plotW * (x - xMin)) / Math.max(x1 - xMin, 1e-9);
  const py = (y) => PAD.top + plotH - (plotH * (f(y) - lo)) / (hi - lo);
  ctx.strokeStyle = "#ccd";
  ctx.strokeRect(PAD.left, PAD.top, plotW, plotH);
  ctx.fillStyle = "#556";
  const unf = (v) => (logY ? 10 ** v : v);
  for (const t of [0, 0.5, 1]) {
    const v = lo + t * (hi - lo);
    ctx.fillText(label(unf(v)), 2, PAD.top + plotH - t * plotH + 4);
  }
  ctx.fillText(label(xMin), PAD.left, height - 10);
  const end = label(x1);
  ctx.fillText(end, width - PAD.right - ctx.measureText(end).width, height - 10);
  if (xLabel) ctx.fillText(xLabel, PAD.left + plotW / 2 - ctx.measureText(xLabel).width / 2, height - 10);
  if (yLabel) ctx.fillText(yLabel + (logY ? " (log)" : ""), PAD.left + 4, PAD.top + 14);
  for (const s of drawn) {
    ctx.strokeStyle = ctx.fillStyle = s.color;
    if (s.dots) {
      for (const [x, y] of s.points) {
        ctx.beginPath();
        ctx.arc(px(x), py(y), 3.5, 0, 2 * Math.PI);
        ctx.fill();
      }
    } else {
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      s.points.forEach(([x, y], i) => (i === 0 ? ctx.moveTo(px(x), py(y)) : ctx.lineTo(px(x), py(y))));
      ctx.stroke();
    }
  }
  // The legend, top right inside the plot.
  let ly = PAD.top + 14;
  for (const s of drawn.filter((s) => s.name)) {
    const w = ctx.measureText(s.name).width;
    ctx.fillStyle = s.color;
    ctx.fillRect(width - PAD.right - w - 22, ly - 8, 12, 3);
    ctx.fillStyle = "#334";
    ctx.fillText(s.name, width - PAD.right - w - 6, ly);
    ly += 15;
  }
}

/**
 * Draws stacked horizontal bars: `bars` ([{ label, parts: [{ name, value }] }]), every bar's
 * parts in the same order and colours, with a legend of the parts and each bar's total in `unit`.
 */
export function stackedBars(canvas, { bars, unit = "", title = "" }) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  ctx.font = "12px system-ui, sans-serif";
  canvas.dataset.points = String(bars.length);
  canvas.dataset.series = String(bars[0]?.parts.length ?? 0);
  ctx.fillStyle = "#223";
  if (title) ctx.fillText(title, 4, 14);
  const names = bars[0]?.parts.map((p) => p.name) ?? [];
  const max = Math.max(...bars.map((b) => b.parts.reduce((t, p) => t + p.value, 0)), 1e-9);
  const left = 110;
  const legendH = 18 * Math.ceil(names.length / 4);
  const barH = Math.max(10, Math.min(28, (height - 30 - legendH) / Math.max(bars.length, 1) - 6));
  bars.forEach((b, i) => {
    const y = 24 + i * (barH + 6);
    let x = left;
    const total = b.parts.reduce((t, p) => t + p.value, 0);
    b.parts.forEach((p, j) => {
      const w = ((width - left - 70) * p.value) / max;
      ctx.fillStyle = PALETTE[j % PALETTE.length];
      ctx.fillRect(x, y, w, barH);
      x += w;
    });
    ctx.fillStyle = "#334";
    ctx.fillText(b.label.slice(0, 16), 4, y + barH / 2 + 4);
    ctx.fillText(`${label(total)} ${unit}`, x + 4, y + barH / 2 + 4);
  });
  names.forEach((n, j) => {
    const x = 4 + (j % 4) * ((width - 8) / 4);
    const y = height - legendH + 12 + 18 * Math.floor(j / 4);
    ctx.fillStyle = PALETTE[j % PALETTE.length];
    ctx.fillRect(x, y - 9, 10, 10);
    ctx.fillStyle = "#334";
    ctx.fillText(n, x + 14, y);
  });
}

// The page of `gpen-tune serve`: one photo to POST /v1/enhance, the result beside the original behind a slider.
"use strict";
const $ = (id) => document.getElementById(id);
let picked = null;
let resultUrl = null;

function setStatus(text, state) {
  $("status").textContent = text;
  $("status").dataset.state = state;
}

function pick(file) {
  if (!file) return;
  picked = file;
  $("before").src = URL.createObjectURL(file);
  $("restore").disabled = false;
  setStatus(`${file.name}: ready to restore.`, "picked");
}

function showSplit() {
  $("after-clip").style.clipPath = `inset(0 0 0 ${$("split").value}%)`;
}

async function restore() {
  if (!picked) return;
  $("restore").disabled = true;
  setStatus("Restoring...", "working");
  const params = new URLSearchParams({ strength: $("strength").value });
  const headers = { "Content-Type": picked.type || "application/octet-stream" };
  if ($("token").value) headers.Authorization = `Bearer ${$("token").value}`;
  try {
    const res = await fetch(`v1/enhance?${params}`, { method: "POST", body: picked, headers });
    if (!res.ok) {
      const err = await res.json().catch(() => ({ error: res.statusText }));
      throw new Error(`${res.status}: ${err.error}`);
    }
    const blob = await res.blob();
    if (resultUrl) URL.revokeObjectURL(resultUrl);
    resultUrl = URL.createObjectURL(blob);
    await new Promise((resolve, reject) => {
      $("after").onload = resolve;
      $("after").onerror = () => reject(new Error("the result could not be shown"));
      $("after").src = resultUrl;
    });
    $("compare").hidden = false;
    const dot = picked.name.lastIndexOf(".");
    $("download").href = resultUrl;
    $("download").download = `${dot > 0 ? picked.name.slice(0, dot) : picked.name}_restored` +
      (dot > 0 ? picked.name.slice(dot) : "");
    $("download").hidden = false;
    setStatus(`Done: ${res.headers.get("X-Faces")} face(s) restored.`, "done");
  } catch (e) {
    setStatus(`Failed: ${e.message}`, "error");
  } finally {
    $("restore").disabled = false;
  }
}

$("file").addEventListener("change", (e) => pick(e.target.files[0]));
$("strength").addEventListener("input", () => {
  $("strength-value").textContent = Number($("strength").value).toFixed(2);
});
$("split").addEventListener("input", showSplit);
$("restore").addEventListener("click", restore);
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  pick(e.dataTransfer.files[0]);
});

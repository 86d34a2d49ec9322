#include "chorus/observe/metrics_server.h"

namespace chorus::observe {
namespace {

// Everything inline: the page must work where nothing outside the agent can be reached. Charts
// are SVG drawn by the script; each line carries data-rank and data-points (what the page test
// checks in the DOM).
constexpr const char* kPage = R"html(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>chorus — live</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:18px;margin:0 0 8px}
#alerts{padding:6px 10px;margin:8px 0;border-radius:4px;background:#e8f5e9}
#alerts.bad{background:#ffebee;color:#b71c1c;font-weight:600}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
.card h2{font-size:14px;margin:0 0 4px}
svg{width:100%;height:180px}
table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:right}
.legend span{margin-right:12px}
</style></head>
<body data-updates="0">
<h1>chorus — node <span id="node">?</span>, step <span id="step">?</span><span id="generation"></span></h1>
<div id="alerts">waiting for the first step…</div>
<div class="card"><h2>Plan: shares of the global batch (B = <span id="batch">?</span>)</h2>
<table id="plan"><thead><tr><th>rank</th><th>device</th><th>share</th><th>busy</th>
<th>memory</th><th>last report</th></tr></thead><tbody></tbody></table>
<div class="legend" id="legend"></div></div>
<div class="grid">
<div class="card"><h2>Share per rank (samples)</h2><svg id="chart-share" data-chart="share"></svg></div>
<div class="card"><h2>Compute per rank (ms)</h2><svg id="chart-compute" data-chart="compute"></svg></div>
<div class="card"><h2>Wait for all-reduce per rank (ms)</h2><svg id="chart-wait" data-chart="wait"></svg></div>
<div class="card"><h2>Memory per rank (MiB)</h2><svg id="chart-memory" data-chart="memory"></svg></div>
<div class="card"><h2>Throughput (samples/s)</h2><svg id="chart-throughput" data-chart="throughput"></svg></div>
<div class="card"><h2>Loss</h2><svg id="chart-loss" data-chart="loss"></svg></div>
</div>
<script>
"use strict";
const COLORS=["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b","#e377c2","#17becf"];
const NS="http://www.w3.org/2000/svg";
function el(name,attrs,parent){const e=document.createElementNS(NS,name);
  for(const k in attrs)e.setAttribute(k,attrs[k]);if(parent)parent.appendChild(e);return e;}
function fmt(v){const a=Math.abs(v);return a>=100?v.toFixed(0):a>=1?v.toFixed(2):a>=0.01||a===0?v.toFixed(3):v.toExponential(1);}
// lines: [{key, rank, xs, ys}]
function draw(svg,lines){
  while(svg.firstChild)svg.removeChild(svg.firstChild);
  const W=420,H=180,L=48,R=8,T=8,B=20;svg.setAttribute("viewBox","0 0 "+W+" "+H);
  let xs=[],ys=[];for(const l of lines){xs=xs.concat(l.xs);ys=ys.concat(l.ys);}
  if(!xs.length){el("text",{x:W/2,y:H/2,"text-anchor":"middle",fill:"#999"},svg).textContent="no data";return;}
  const x0=Math.min(...xs),x1=Math.max(...xs,x0+1),y0=Math.min(0,...ys),y1=Math.max(...ys,y0+1e-9);
  const sx=x=>L+(x-x0)/(x1-x0)*(W-L-R),sy=y=>H-B-(y-y0)/(y1-y0)*(H-T-B);
  el("line",{x1:L,y1:H-B,x2:W-R,y2:H-B,stroke:"#888"},svg);el("line",{x1:L,y1:T,x2:L,y2:H-B,stroke:"#888"},svg);
  el("text",{x:L-4,y:T+10,"text-anchor":"end","font-size":10},svg).textContent=fmt(y1);
  el("text",{x:L-4,y:H-B,"text-anchor":"end","font-size":10},svg).textContent=fmt(y0);
  el("text",{x:L,y:H-4,"font-size":10},svg).textContent="step "+x0;
  el("text",{x:W-R,y:H-4,"text-anchor":"end","font-size":10},svg).textContent="step "+x1;
  lines.forEach((l,i)=>{const pts=l.xs.map((x,j)=>sx(x).toFixed(1)+","+sy(l.ys[j]).toFixed(1)).join(" ");
    el("polyline",{class:"series",points:pts,fill:"none","stroke-width":1.5,
      stroke:COLORS[(l.rank>=0?l.rank:i)%COLORS.length],"data-rank":l.rank,"data-points":l.xs.length},svg);});
}
function perRank(state,key,scale){return state.ranks.map(r=>({rank:r.rank,xs:r.series.step,
  ys:r.series[key].map(v=>v*scale)}));}
function render(state){
  document.getElementById("node").textContent=state.node;
  const step=Math.max(0,...state.ranks.map(r=>r.step));document.getElementById("step").textContent=step;
  document.getElementById("batch").textContent=state.plan.global_batch;
  document.getElementById("generation").textContent=state.generation?", generation "+state.generation:"";
  const alerts=document.getElementById("alerts");
  alerts.textContent=state.alerts.length?state.alerts.join(" · "):"all ranks reporting; none holds back the step";
  alerts.className=state.alerts.length?"bad":"";
  const body=document.querySelector("#plan tbody");body.innerHTML="";
  for(const r of state.ranks){const tr=document.createElement("tr");
    const mem=r.series.memory_bytes.length?r.series.memory_bytes[r.series.memory_bytes.length-1]:0;
    const cells=[r.rank,r.device+(r.emulated?" (emulated)":""),state.plan.shares[String(r.rank)],
      (100*r.utilization).toFixed(0)+"%",(mem/1048576).toFixed(0)+" MiB"+(r.memory_budget?" of "+
      (r.memory_budget/1048576).toFixed(0):""),r.age_s.toFixed(1)+" s ago"];
    for(const c of cells){const td=document.createElement("td");td.textContent=c;tr.appendChild(td);}
    tr.style.color=COLORS[r.rank%COLORS.length];body.appendChild(tr);}
  draw(document.getElementById("chart-share"),perRank(state,"share",1));
  draw(document.getElementById("chart-compute"),perRank(state,"compute_s",1000));
  draw(document.getElementById("chart-wait"),perRank(state,"wait_s",1000));
  draw(document.getElementById("chart-memory"),perRank(state,"memory_bytes",1/1048576));
  draw(document.getElementById("chart-throughput"),[{rank:-1,xs:state.job.step,ys:state.job.samples_per_s}]);
  draw(document.getElementById("chart-loss"),[{rank:-1,xs:state.job.step,ys:state.job.loss}]);
  document.body.dataset.updates=String(Number(document.body.dataset.updates)+1);
  document.body.dataset.ranks=String(state.ranks.length);
}
async function poll(){
  try{const response=await fetch("api/state",{cache:"no-store"});render(await response.json());}
  catch(e){const a=document.getElementById("alerts");a.textContent="agent unreachable: "+e;a.className="bad";}
  setTimeout(poll,1000);
}
poll();
</script></body></html>
)html";

}  // namespace

const std::string& livePageHtml() {
  static const std::string page(kPage);
  return page;
}

}  // namespace chorus::observe

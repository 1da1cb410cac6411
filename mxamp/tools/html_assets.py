"""The style sheet and the script every report page carries inline (a report
is one file per page, read offline: nothing is fetched).

The script does three things, each on elements the page marks:
- ``.graphview``: pan (drag), zoom (wheel or buttons) and find a node by
  name in the graph picture (its ``g.node`` elements carry ``data-name``);
- ``table.sortable``: click a heading to sort (cells with ``data-v`` sort
  as numbers), type in the table's ``.filter`` box to show matching rows;
- ``a.node-link``: jump to that node in the page's graph; so does a page
  address ending in ``#find=NODE``.
"""

STYLE = """
body{font-family:DejaVu Sans,Arial,sans-serif;margin:1.2em 2em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 7px;font-size:13px;text-align:left;white-space:nowrap}
th{background:#f0f0f0} table.sortable th{cursor:pointer;user-select:none}
table.sortable th.up::after{content:" \\25B2"} table.sortable th.down::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.filter{margin:.3em 0;padding:3px 6px;width:24em}
.legend span{display:inline-block;margin-right:1.2em;font-size:13px}
.legend i{display:inline-block;width:14px;height:14px;border:1px solid #555;
 vertical-align:middle;margin-right:4px}
.graphview{border:1px solid #aaa;position:relative}
.graphview .tools{padding:4px;background:#f6f6f6;border-bottom:1px solid #ccc;font-size:13px}
.graphview .tools button{min-width:2.2em}
.graphview svg{display:block;width:100%;height:72vh;cursor:grab;background:#fff}
.graphview svg text{font-family:DejaVu Sans,Arial,sans-serif;pointer-events:none}
.graphview g.node.hit rect{stroke:#d62728;stroke-width:4}
.plot svg{max-width:100%;height:auto}
.note{color:#555;font-size:13px}
"""

SCRIPT = r"""
(function(){
function views(){return Array.prototype.slice.call(document.querySelectorAll('.graphview'));}
function setup(view){
  var svg=view.querySelector('svg'), W=+svg.dataset.width, H=+svg.dataset.height;
  var box={x:0,y:0,w:W,h:H}, drag=null, hits=[], hit=-1;
  var info=view.querySelector('.found');
  function px(){var r=svg.getBoundingClientRect();return [r.width||1,r.height||1];}
  function show(){svg.setAttribute('viewBox',[box.x,box.y,box.w,box.h].join(' '));}
  function scale(s,cx,cy){var p=px();
    box.x=cx-(cx-box.x)/s;box.y=cy-(cy-box.y)/s;box.w/=s;box.h/=s;
    box.w=Math.max(box.w,p[0]/8);box.h=box.w*p[1]/p[0];show();}
  function actual(cx,cy){var p=px();box.w=p[0];box.h=p[1];
    box.x=cx-box.w/2;box.y=cy-box.h/2;show();}
  function fit(){var p=px(),s=Math.max(W/p[0],H/p[1]);
    box.w=p[0]*s;box.h=p[1]*s;box.x=(W-box.w)/2;box.y=(H-box.h)/2;show();}
  function fitWidth(){var p=px(),s=Math.max(W/p[0],1);
    box.w=p[0]*s;box.h=p[1]*s;box.x=(W-box.w)/2;box.y=0;show();}
  function centre(){return [box.x+box.w/2,box.y+box.h/2];}
  function at(e){var r=svg.getBoundingClientRect();
    return [box.x+(e.clientX-r.left)/r.width*box.w,box.y+(e.clientY-r.top)/r.height*box.h];}
  svg.addEventListener('wheel',function(e){e.preventDefault();var c=at(e);
    scale(e.deltaY<0?1.25:0.8,c[0],c[1]);},{passive:false});
  svg.addEventListener('mousedown',function(e){drag=[e.clientX,e.clientY];
    svg.style.cursor='grabbing';});
  window.addEventListener('mouseup',function(){drag=null;svg.style.cursor='grab';});
  window.addEventListener('mousemove',function(e){if(!drag)return;var p=px();
    box.x-=(e.clientX-drag[0])*box.w/p[0];box.y-=(e.clientY-drag[1])*box.h/p[1];
    drag=[e.clientX,e.clientY];show();});
  function go(i){
    hits.forEach(function(g){g.classList.remove('hit');});
    if(!hits.length){info.textContent='no match';return;}
    hit=(i+hits.length)%hits.length;var g=hits[hit];g.classList.add('hit');
    actual(+g.dataset.x,+g.dataset.y);
    info.textContent=(hit+1)+' of '+hits.length+': '+g.dataset.name;}
  function find(text,exact){text=text.trim().toLowerCase();
    var all=Array.prototype.slice.call(svg.querySelectorAll('g.node'));
    hits=!text?[]:all.filter(function(g){var n=g.dataset.name.toLowerCase();
      return exact?n===text:n.indexOf(text)>=0;});
    go(0);}
  var input=view.querySelector('input');
  input.addEventListener('keydown',function(e){if(e.key==='Enter'){
    if(hits.length&&input.dataset.last===input.value){go(hit+(e.shiftKey?-1:1));}
    else{input.dataset.last=input.value;find(input.value,false);}}});
  view.querySelector('.zoom-in').onclick=function(){var c=centre();scale(1.25,c[0],c[1]);};
  view.querySelector('.zoom-out').onclick=function(){var c=centre();scale(0.8,c[0],c[1]);};
  view.querySelector('.fit').onclick=fit;
  view.querySelector('.fit-width').onclick=fitWidth;
  view.querySelector('.actual').onclick=function(){var c=centre();actual(c[0],c[1]);};
  view.findNode=function(name){input.value=name;input.dataset.last=name;find(name,true);
    view.scrollIntoView({block:'start'});};
  var top=null;Array.prototype.forEach.call(svg.querySelectorAll('g.node'),function(g){
    if(!top||+g.dataset.y<+top.dataset.y)top=g;});
  var p=px();actual(top?+top.dataset.x:W/2,p[1]/2);
}
function sortable(table){
  var heads=table.querySelectorAll('th'), body=table.tBodies[0];
  Array.prototype.forEach.call(heads,function(th,col){th.onclick=function(){
    var down=th.classList.contains('up');
    Array.prototype.forEach.call(heads,function(h){h.classList.remove('up','down');});
    th.classList.add(down?'down':'up');
    var rows=Array.prototype.slice.call(body.rows);
    function key(r){var c=r.cells[col];return c.dataset.v!==undefined?+c.dataset.v:c.textContent;}
    rows.sort(function(a,b){var x=key(a),y=key(b);
      var o=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));
      return down?-o:o;});
    rows.forEach(function(r){body.appendChild(r);});};});
  var box=table.previousElementSibling;
  if(box&&box.classList.contains('filter')){box.addEventListener('input',function(){
    var words=box.value.toLowerCase().split(/\s+/).filter(Boolean);
    Array.prototype.forEach.call(body.rows,function(r){var t=r.textContent.toLowerCase();
      r.style.display=words.every(function(w){return t.indexOf(w)>=0;})?'':'none';});});}
}
document.addEventListener('DOMContentLoaded',function(){
  views().forEach(setup);
  var wanted=/^#find=(.+)$/.exec(location.hash);
  if(wanted&&views()[0]){views()[0].findNode(decodeURIComponent(wanted[1]));}
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),sortable);
  document.addEventListener('click',function(e){var a=e.target.closest('a.node-link');
    if(!a)return;var v=views()[0];if(!v)return;e.preventDefault();v.findNode(a.dataset.node);});
});
})();
"""

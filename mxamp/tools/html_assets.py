"""The style sheet and the script every report page carries inline (a report
is one file per page, read offline: nothing is fetched).

The script does three things, each on elements the page marks:
- ``.graphview``: pan (drag), zoom (wheel or buttons) and find a node by
  name in the graph picture (``svg.graph``, whose ``g.node`` elements carry
  ``data-name``); an overview (``.overview``) shows the whole graph with a
  frame where the view is, and a click or drag in it moves the view; a
  ``.show-casts`` box swaps the picture for the one with parameter casts;
- ``table.sortable``: click a heading to sort (cells with ``data-v`` sort
  as numbers), type in the table's ``.filter`` box to show the rows where
  every word starts a word of the row (so "float16" is not "bfloat16");
- ``a.node-link``: jump to that node in the page's graph; so does a page
  address ending in ``#find=NODE``.
"""

STYLE = """
body{font-family:DejaVu Sans,Arial,sans-serif;margin:1.2em 2em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;max-width:100%}
td,th{border:1px solid #ccc;padding:2px 7px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f0f0f0;white-space:nowrap} table.sortable th{cursor:pointer;user-select:none}
table.sortable th.up::after{content:" \\25B2"} table.sortable th.down::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.filter{margin:.3em 0;padding:3px 6px;width:24em}
.legend span{display:inline-block;margin-right:1.2em;font-size:13px}
.legend i{display:inline-block;width:14px;height:14px;border:1px solid #555;
 vertical-align:middle;margin-right:4px}
.legend b.badge{display:inline-block;background:#e5e5e5;border:1px solid #777;
 border-radius:8px;font-size:10px;font-weight:normal;padding:0 4px;margin-right:4px}
.graphview{border:1px solid #aaa}
.graphview .tools{padding:4px;background:#f6f6f6;border-bottom:1px solid #ccc;font-size:13px}
.graphview .tools button{min-width:2.2em}
.graphview .panes{display:flex;height:80vh}
.graphview svg.graph{display:block;flex:1;min-width:0;height:100%;cursor:grab;background:#fff}
.graphview svg text{font-family:DejaVu Sans,Arial,sans-serif;pointer-events:none}
.graphview g.node.hit rect{stroke:#d62728;stroke-width:4}
.graphview .overview{width:180px;flex:none;border-left:1px solid #ccc;background:#fafafa;
 cursor:crosshair}
.graphview .overview svg{display:block;width:100%;height:100%}
.graphview .overview .frame{fill:rgba(214,39,40,.12);stroke:#d62728;stroke-width:2;
 vector-effect:non-scaling-stroke}
.plot svg{max-width:100%;height:auto}
.note{color:#555;font-size:13px}
"""

SCRIPT = r"""
(function(){
function all(root,selector){return Array.prototype.slice.call(root.querySelectorAll(selector));}
function views(){return all(document,'.graphview');}
function setup(view){
  var graphs=all(view,'svg.graph'), over=view.querySelector('.overview svg');
  var frame=over.querySelector('.frame'), use=over.querySelector('use');
  var casts=view.querySelector('.show-casts'), info=view.querySelector('.found');
  var svg, W, H, box, drag=null, moving=false, hits=[], hit=-1;
  function px(){var r=svg.getBoundingClientRect();return [r.width||1,r.height||1];}
  function show(){svg.setAttribute('viewBox',[box.x,box.y,box.w,box.h].join(' '));
    frame.setAttribute('x',box.x);frame.setAttribute('y',box.y);
    frame.setAttribute('width',box.w);frame.setAttribute('height',box.h);}
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
  function select(next){  // show one picture; the view keeps its place and scale
    var old=svg&&[box.x+box.w/2,box.y+box.h/2,box.w];
    graphs.forEach(function(g){g.style.display=g===next?'':'none';});
    var fx=old?old[0]/W:0, fy=old?old[1]/H:0;
    svg=next;W=+svg.dataset.width;H=+svg.dataset.height;box={x:0,y:0,w:W,h:H};
    over.setAttribute('viewBox','0 0 '+W+' '+H);
    use.setAttribute('href','#'+svg.dataset.content);
    if(old){box.w=old[2];var p=px();box.h=box.w*p[1]/p[0];
      box.x=fx*W-box.w/2;box.y=fy*H-box.h/2;show();}
    else{var top=null,q=px();all(svg,'g.node').forEach(function(g){
        if(!top||+g.dataset.y<+top.dataset.y)top=g;});
      // 1:1 from the top: the whole width when it fits, else around the first node
      actual(W<=q[0]?W/2:top?+top.dataset.x:W/2,q[1]/2);}}
  graphs.forEach(function(g){
    g.addEventListener('wheel',function(e){e.preventDefault();var c=at(e);
      scale(e.deltaY<0?1.25:0.8,c[0],c[1]);},{passive:false});
    g.addEventListener('mousedown',function(e){drag=[e.clientX,e.clientY];
      svg.style.cursor='grabbing';});});
  window.addEventListener('mouseup',function(){drag=null;moving=false;svg.style.cursor='grab';});
  window.addEventListener('mousemove',function(e){
    if(moving){moveTo(e);return;}
    if(!drag)return;var p=px();
    box.x-=(e.clientX-drag[0])*box.w/p[0];box.y-=(e.clientY-drag[1])*box.h/p[1];
    drag=[e.clientX,e.clientY];show();});
  function moveTo(e){var m=over.getScreenCTM();if(!m)return;
    var p=over.createSVGPoint();p.x=e.clientX;p.y=e.clientY;p=p.matrixTransform(m.inverse());
    box.x=p.x-box.w/2;box.y=p.y-box.h/2;show();}
  over.addEventListener('mousedown',function(e){e.preventDefault();moving=true;moveTo(e);});
  function go(i){
    hits.forEach(function(g){g.classList.remove('hit');});
    if(!hits.length){info.textContent='no match';return;}
    hit=(i+hits.length)%hits.length;var g=hits[hit];g.classList.add('hit');
    actual(+g.dataset.x,+g.dataset.y);
    info.textContent=(hit+1)+' of '+hits.length+': '+g.dataset.name;}
  function matches(graph,text,exact){return all(graph,'g.node').filter(function(g){
    var n=g.dataset.name.toLowerCase();return exact?n===text:n.indexOf(text)>=0;});}
  function find(text,exact){text=text.trim().toLowerCase();
    hits=text?matches(svg,text,exact):[];
    var other=graphs.filter(function(g){return g!==svg;})[0];
    if(text&&!hits.length&&other&&matches(other,text,exact).length){  // a parameter cast
      casts.checked=!casts.checked;select(other);hits=matches(svg,text,exact);}
    go(0);}
  var input=view.querySelector('input.find');
  input.addEventListener('keydown',function(e){if(e.key==='Enter'){
    if(hits.length&&input.dataset.last===input.value){go(hit+(e.shiftKey?-1:1));}
    else{input.dataset.last=input.value;find(input.value,false);}}});
  if(casts){casts.addEventListener('change',function(){hits=[];info.textContent='';
    select(graphs[casts.checked?1:0]);});}
  view.querySelector('.zoom-in').onclick=function(){var c=centre();scale(1.25,c[0],c[1]);};
  view.querySelector('.zoom-out').onclick=function(){var c=centre();scale(0.8,c[0],c[1]);};
  view.querySelector('.fit').onclick=fit;
  view.querySelector('.fit-width').onclick=fitWidth;
  view.querySelector('.actual').onclick=function(){var c=centre();actual(c[0],c[1]);};
  view.findNode=function(name){input.value=name;input.dataset.last=name;find(name,true);
    view.scrollIntoView({block:'start'});};
  select(graphs[0]);
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
    // a word matches where a cell or a word in it starts: after a character
    // that is not a letter (so "float16" is not found in "bfloat16")
    var words=box.value.toLowerCase().split(/\s+/).filter(Boolean).map(function(w){
      return new RegExp('(^|[^a-z])'+w.replace(/[.*+?^${}()|[\]\\]/g,'\\$&'),'m');});
    Array.prototype.forEach.call(body.rows,function(r){
      var t=Array.prototype.map.call(r.cells,function(c){return c.textContent;})
        .join('\n').toLowerCase();
      r.style.display=words.every(function(w){return w.test(t);})?'':'none';});});}
}
document.addEventListener('DOMContentLoaded',function(){
  views().forEach(setup);
  var wanted=/^#find=(.+)$/.exec(location.hash);
  if(wanted&&views()[0]){views()[0].findNode(decodeURIComponent(wanted[1]));}
  all(document,'table.sortable').forEach(sortable);
  document.addEventListener('click',function(e){var a=e.target.closest('a.node-link');
    if(!a)return;var v=views()[0];if(!v)return;e.preventDefault();v.findNode(a.dataset.node);});
});
})();
"""

var e,t,n,r,i,a,o,s,c,l,u,d,f,p,m={},h=[],g=/acit|ex(?:s|g|n|p|$)|rph|grid|ows|mnc|ntw|ine[ch]|zoo|^ord|itera/i,_=Array.isArray;function v(e,t){for(var n in t)e[n]=t[n];return e}function y(e){e&&e.parentNode&&e.parentNode.removeChild(e)}function b(t,n,r){var i,a,o,s={};for(o in n)o==`key`?i=n[o]:o==`ref`?a=n[o]:s[o]=n[o];if(arguments.length>2&&(s.children=arguments.length>3?e.call(arguments,2):r),typeof t==`function`&&t.defaultProps!=null)for(o in t.defaultProps)s[o]===void 0&&(s[o]=t.defaultProps[o]);return x(t,s,i,a,null)}function x(e,r,i,a,o){var s={type:e,props:r,key:i,ref:a,__k:null,__:null,__b:0,__e:null,__c:null,constructor:void 0,__v:o??++n,__i:-1,__u:0};return o==null&&t.vnode!=null&&t.vnode(s),s}function S(e){return e.children}function C(e,t){this.props=e,this.context=t}function w(e,t){if(t==null)return e.__?w(e.__,e.__i+1):null;for(var n;t<e.__k.length;t++)if((n=e.__k[t])!=null&&n.__e!=null)return n.__e;return typeof e.type==`function`?w(e):null}function ee(e){if(e.__P&&e.__d){var n=e.__v,r=n.__e,i=[],a=[],o=v({},n);o.__v=n.__v+1,t.vnode&&t.vnode(o),N(e.__P,o,n,e.__n,e.__P.namespaceURI,32&n.__u?[r]:null,i,r??w(n),!!(32&n.__u),a),o.__v=n.__v,o.__.__k[o.__i]=o,ie(i,o,a),n.__e=n.__=null,o.__e!=r&&T(o)}}function T(e){if((e=e.__)!=null&&e.__c!=null)return e.__e=e.__c.base=null,e.__k.some(function(t){if(t!=null&&t.__e!=null)return e.__e=e.__c.base=t.__e}),T(e)}function E(e){(!e.__d&&(e.__d=!0)&&r.push(e)&&!D.__r++||i!=t.debounceRendering)&&((i=t.debounceRendering)||a)(D)}function D(){try{for(var e,t=1;r.length;)r.length>t&&r.sort(o),e=r.shift(),t=r.length,ee(e)}finally{r.length=D.__r=0}}function te(e,t,n,r,i,a,o,s,c,l,u){var d,f,p,g,_,v,y=r&&r.__k||h,b=t.length;for(c=O(n,t,y,c,b),d=0;d<b;d++)(p=n.__k[d])!=null&&(f=p.__i!=-1&&y[p.__i]||m,p.__i=d,v=N(e,p,f,i,a,o,s,c,l,u),g=p.__e,p.ref&&f.ref!=p.ref&&(f.ref&&P(f.ref,null,p),u.push(p.ref,p.__c||g,p)),_==null&&g!=null&&(_=g),4&p.__u?(c=k(p,c,e),f.__e&&(f.__e=null)):typeof p.type==`function`&&v!==void 0?c=v:g&&(c=g.nextSibling),p.__u&=-7);return n.__e=_,c}function O(e,t,n,r,i){var a,o,s,c,l,u=n.length,d=u,f=0;for(e.__k=Array(i),a=0;a<i;a++)(o=t[a])!=null&&typeof o!=`boolean`&&typeof o!=`function`?(typeof o==`string`||typeof o==`number`||typeof o==`bigint`||o.constructor==String?o=e.__k[a]=x(null,o,null,null,null):_(o)?o=e.__k[a]=x(S,{children:o},null,null,null):o.constructor===void 0&&o.__b>0?o=e.__k[a]=x(o.type,o.props,o.key,o.ref?o.ref:null,o.__v):e.__k[a]=o,c=a+f,o.__=e,o.__b=e.__b+1,s=null,(l=o.__i=ne(o,n,c,d))!=-1&&(d--,(s=n[l])&&(s.__u|=2)),s==null||s.__v==null?(l==-1&&(i>u?f--:i<u&&f++),typeof o.type!=`function`&&(o.__u|=4)):l!=c&&(l==c-1?f--:l==c+1?f++:(l>c?f--:f++,o.__u|=4))):e.__k[a]=null;if(d)for(a=0;a<u;a++)(s=n[a])!=null&&!(2&s.__u)&&(s.__e==r&&(r=w(s)),se(s,s));return r}function k(e,t,n){var r,i;if(typeof e.type==`function`){for(r=e.__k,i=0;r&&i<r.length;i++)r[i]&&(r[i].__=e,t=k(r[i],t,n));return t}e.__e!=t&&(t&&e.type&&!t.parentNode&&(t=w(e)),t=n.insertBefore(e.__e,t||null));do t&&=t.nextSibling;while(t!=null&&t.nodeType==8);return t}function ne(e,t,n,r){var i,a,o,s=e.key,c=e.type,l=t[n],u=l!=null&&!(2&l.__u);if(l===null&&s==null||u&&s==l.key&&c==l.type)return n;if(r>+!!u){for(i=n-1,a=n+1;i>=0||a<t.length;)if((l=t[o=i>=0?i--:a++])!=null&&!(2&l.__u)&&s==l.key&&c==l.type)return o}return-1}function A(e,t,n){t[0]==`-`?e.setProperty(t,n??``):e[t]=n==null?``:typeof n!=`number`||g.test(t)?n:n+`px`}function j(e,t,n,r,i){var a,o;e:if(t==`style`){if(typeof n==`string`)e.style.cssText=n;else{if(typeof r==`string`&&(e.style.cssText=r=``),r)for(t in r)n&&t in n||A(e.style,t,``);if(n)for(t in n)r&&n[t]==r[t]||A(e.style,t,n[t])}}else if(t[0]==`o`&&t[1]==`n`)a=t!=(t=t.replace(u,`$1`)),o=t.toLowerCase(),t=o in e||t==`onFocusOut`||t==`onFocusIn`?o.slice(2):t.slice(2),e.l||={},e.l[t+a]=n,n?r?n[l]=r[l]:(n[l]=d,e.addEventListener(t,a?p:f,a)):e.removeEventListener(t,a?p:f,a);else{if(i==`http://www.w3.org/2000/svg`)t=t.replace(/xlink(H|:h)/,`h`).replace(/sName$/,`s`);else if(t!=`width`&&t!=`height`&&t!=`href`&&t!=`list`&&t!=`form`&&t!=`tabIndex`&&t!=`download`&&t!=`rowSpan`&&t!=`colSpan`&&t!=`role`&&t!=`popover`&&t in e)try{e[t]=n??``;break e}catch{}typeof n==`function`||(n==null||!1===n&&t[4]!=`-`?e.removeAttribute(t):e.setAttribute(t,t==`popover`&&n==1?``:n))}}function M(e){return function(n){if(this.l){var r=this.l[n.type+e];if(n[c]==null)n[c]=d++;else if(n[c]<r[l])return;return r(t.event?t.event(n):n)}}}function N(e,n,r,i,a,o,s,c,l,u){var d,f,p,m,g,b,x,ee,T,E,D,O,k,ne,A,j,M=n.type;if(n.constructor!==void 0)return null;128&r.__u&&(l=!!(32&r.__u),o=[c=n.__e=r.__e]),(d=t.__b)&&d(n);e:if(typeof M==`function`){f=s.length;try{if(T=n.props,E=M.prototype&&M.prototype.render,D=(d=M.contextType)&&i[d.__c],O=d?D?D.props.value:d.__:i,r.__c?ee=(p=n.__c=r.__c).__=p.__E:(E?n.__c=p=new M(T,O):(n.__c=p=new C(T,O),p.constructor=M,p.render=ce),D&&D.sub(p),p.state||(p.state={}),p.__n=i,m=p.__d=!0,p.__h=[],p._sb=[]),E&&p.__s==null&&(p.__s=p.state),E&&M.getDerivedStateFromProps!=null&&(p.__s==p.state&&(p.__s=v({},p.__s)),v(p.__s,M.getDerivedStateFromProps(T,p.__s))),g=p.props,b=p.state,p.__v=n,m)E&&M.getDerivedStateFromProps==null&&p.componentWillMount!=null&&p.componentWillMount(),E&&p.componentDidMount!=null&&p.__h.push(p.componentDidMount);else{if(E&&M.getDerivedStateFromProps==null&&T!==g&&p.componentWillReceiveProps!=null&&p.componentWillReceiveProps(T,O),n.__v==r.__v||!p.__e&&p.shouldComponentUpdate!=null&&!1===p.shouldComponentUpdate(T,p.__s,O)){n.__v!=r.__v&&(p.props=T,p.state=p.__s,p.__d=!1),n.__e=r.__e,n.__k=r.__k,n.__k.some(function(e){e&&(e.__=n)}),h.push.apply(p.__h,p._sb),p._sb=[],p.__h.length&&s.push(p),c=w(r);break e}p.componentWillUpdate!=null&&p.componentWillUpdate(T,p.__s,O),E&&p.componentDidUpdate!=null&&p.__h.push(function(){p.componentDidUpdate(g,b,x)})}if(p.context=O,p.props=T,p.__P=e,p.__e=!1,k=t.__r,ne=0,E)p.state=p.__s,p.__d=!1,k&&k(n),d=p.render(p.props,p.state,p.context),h.push.apply(p.__h,p._sb),p._sb=[];else do p.__d=!1,k&&k(n),d=p.render(p.props,p.state,p.context),p.state=p.__s;while(p.__d&&++ne<25);p.state=p.__s,p.getChildContext!=null&&(i=v(v({},i),p.getChildContext())),E&&!m&&p.getSnapshotBeforeUpdate!=null&&(x=p.getSnapshotBeforeUpdate(g,b)),A=d!=null&&d.type===S&&d.key==null?ae(d.props.children):d,c=te(e,_(A)?A:[A],n,r,i,a,o,s,c,l,u),p.base=n.__e,n.__u&=-161,p.__h.length&&s.push(p),ee&&(p.__E=p.__=null)}catch(e){if(s.length=f,n.__v=null,l||o!=null){if(e.then){for(n.__u|=l?160:128;c&&c.nodeType==8&&c.nextSibling;)c=c.nextSibling;o!=null&&(o[o.indexOf(c)]=null),n.__e=c}else if(o!=null)for(j=o.length;j--;)y(o[j])}else n.__e=r.__e;n.__k??=r.__k||[],e.then||re(n),t.__e(e,n,r)}}else o==null&&n.__v==r.__v?(n.__k=r.__k,n.__e=r.__e):c=n.__e=oe(r.__e,n,r,i,a,o,s,l,u);return(d=t.diffed)&&d(n),128&n.__u?void 0:c}function re(e){e&&(e.__c&&(e.__c.__e=!0),e.__k&&e.__k.some(re))}function ie(e,n,r){for(var i=0;i<r.length;i++)P(r[i],r[++i],r[++i]);t.__c&&t.__c(n,e),e.some(function(n){try{e=n.__h,n.__h=[],e.some(function(e){e.call(n)})}catch(e){t.__e(e,n.__v)}})}function ae(e){return typeof e!=`object`||!e||e.__b>0?e:_(e)?e.map(ae):e.constructor===void 0?v({},e):null}function oe(n,r,i,a,o,s,c,l,u){var d,f,p,h,g,v,b,x=i.props||m,S=r.props,C=r.type;if(C==`svg`?o=`http://www.w3.org/2000/svg`:C==`math`?o=`http://www.w3.org/1998/Math/MathML`:o||=`http://www.w3.org/1999/xhtml`,s!=null){for(d=0;d<s.length;d++)if((g=s[d])&&`setAttribute`in g==!!C&&(C?g.localName==C:g.nodeType==3)){n=g,s[d]=null;break}}if(n==null){if(C==null)return document.createTextNode(S);n=document.createElementNS(o,C,S.is&&S),l&&=(t.__m&&t.__m(r,s),!1),s=null}if(C==null)x===S||l&&n.data==S||(n.data=S);else{if(s=C==`textarea`&&S.defaultValue!=null?null:s&&e.call(n.childNodes),!l&&s!=null)for(x={},d=0;d<n.attributes.length;d++)x[(g=n.attributes[d]).name]=g.value;for(d in x)g=x[d],d==`dangerouslySetInnerHTML`?p=g:d==`children`||d in S||d==`value`&&`defaultValue`in S||d==`checked`&&`defaultChecked`in S||j(n,d,null,g,o);for(d in S)g=S[d],d==`children`?h=g:d==`dangerouslySetInnerHTML`?f=g:d==`value`?v=g:d==`checked`?b=g:l&&typeof g!=`function`||x[d]===g||j(n,d,g,x[d],o);if(f)l||p&&(f.__html==p.__html||f.__html==n.innerHTML)||(n.innerHTML=f.__html),r.__k=[];else if(p&&(n.innerHTML=``),te(r.type==`template`?n.content:n,_(h)?h:[h],r,i,a,C==`foreignObject`?`http://www.w3.org/1999/xhtml`:o,s,c,s?s[0]:i.__k&&w(i,0),l,u),s!=null)for(d=s.length;d--;)y(s[d]);l&&C!=`textarea`||(d=`value`,C==`progress`&&v==null?n.removeAttribute(`value`):v!=null&&(v!==n[d]||C==`progress`&&!v||C==`option`&&v!=x[d])&&j(n,d,v,x[d],o),d=`checked`,b!=null&&b!=n[d]&&j(n,d,b,x[d],o))}return n}function P(e,n,r){try{if(typeof e==`function`){var i=typeof e.__u==`function`;i&&e.__u(),i&&n==null||(e.__u=e(n))}else e.current=n}catch(e){t.__e(e,r)}}function se(e,n,r){var i,a;if(t.unmount&&t.unmount(e),(i=e.ref)&&(i.current&&i.current!=e.__e||P(i,null,n)),(i=e.__c)!=null){if(i.componentWillUnmount)try{i.componentWillUnmount()}catch(e){t.__e(e,n)}i.base=i.__P=i.__n=null}if(i=e.__k)for(a=0;a<i.length;a++)i[a]&&se(i[a],n,r||typeof e.type!=`function`);r||y(e.__e),e.__c=e.__=e.__e=void 0}function ce(e,t,n){return this.constructor(e,n)}function le(n,r,i){var a,o,s,c;r==document&&(r=document.documentElement),t.__&&t.__(n,r),o=(a=typeof i==`function`)?null:i&&i.__k||r.__k,s=[],c=[],N(r,n=(!a&&i||r).__k=b(S,null,[n]),o||m,m,r.namespaceURI,!a&&i?[i]:o?null:r.firstChild?e.call(r.childNodes):null,s,!a&&i?i:o?o.__e:r.firstChild,a,c),ie(s,n,c),n.props.children=null}e=h.slice,t={__e:function(e,t,n,r){for(var i,a,o;t=t.__;)if((i=t.__c)&&!i.__)try{if((a=i.constructor)&&a.getDerivedStateFromError!=null&&(i.setState(a.getDerivedStateFromError(e)),o=i.__d),i.componentDidCatch!=null&&(i.componentDidCatch(e,r||{}),o=i.__d),o)return i.__E=i}catch(t){e=t}throw e}},n=0,C.prototype.setState=function(e,t){var n=this.__s!=null&&this.__s!=this.state?this.__s:this.__s=v({},this.state);typeof e==`function`&&(e=e(v({},n),this.props)),e&&v(n,e),e!=null&&this.__v&&(t&&this._sb.push(t),E(this))},C.prototype.forceUpdate=function(e){this.__v&&(this.__e=!0,e&&this.__h.push(e),E(this))},C.prototype.render=S,r=[],a=typeof Promise==`function`?Promise.prototype.then.bind(Promise.resolve()):setTimeout,o=function(e,t){return e.__v.__b-t.__v.__b},D.__r=0,s=Math.random().toString(8),c=`__d`+s,l=`__a`+s,u=/(PointerCapture)$|Capture$/i,d=0,f=M(!1),p=M(!0);var ue=function(e,t,n,r){var i;t[0]=0;for(var a=1;a<t.length;a++){var o=t[a++],s=t[a]?(t[0]|=o?1:2,n[t[a++]]):t[++a];o===3?r[0]=s:o===4?r[1]=Object.assign(r[1]||{},s):o===5?(r[1]=r[1]||{})[t[++a]]=s:o===6?r[1][t[++a]]+=s+``:o?(i=e.apply(s,ue(e,s,n,[``,null])),r.push(i),s[0]?t[0]|=2:(t[a-2]=0,t[a]=i)):r.push(s)}return r},de=new Map;function fe(e){var t=de.get(this);return t||(t=new Map,de.set(this,t)),(t=ue(this,t.get(e)||(t.set(e,t=function(e){for(var t,n,r=1,i=``,a=``,o=[0],s=function(e){r===1&&(e||(i=i.replace(/^\s*\n\s*|\s*\n\s*$/g,``)))?o.push(0,e,i):r===3&&(e||i)?(o.push(3,e,i),r=2):r===2&&i===`...`&&e?o.push(4,e,0):r===2&&i&&!e?o.push(5,0,!0,i):r>=5&&((i||!e&&r===5)&&(o.push(r,0,i,n),r=6),e&&(o.push(r,e,0,n),r=6)),i=``},c=0;c<e.length;c++){c&&(r===1&&s(),s(c));for(var l=0;l<e[c].length;l++)t=e[c][l],r===1?t===`<`?(s(),o=[o],r=3):i+=t:r===4?i===`--`&&t===`>`?(r=1,i=``):i=t+i[0]:a?t===a?a=``:i+=t:t===`"`||t===`'`?a=t:t===`>`?(s(),r=1):r&&(t===`=`?(r=5,n=i,i=``):t===`/`&&(r<5||e[c][l+1]===`>`)?(s(),r===3&&(o=o[0]),r=o,(o=o[0]).push(2,0,r),r=0):t===` `||t===`	`||t===`
`||t===`\r`?(s(),r=2):i+=t),r===3&&i===`!--`&&(r=4,o=o[0])}return s(),o}(e)),t),arguments,[])).length>1?t:t[0]}var F=fe.bind(b),I,L,pe,me,he=0,ge=[],R=t,_e=R.__b,ve=R.__r,ye=R.diffed,be=R.__c,xe=R.unmount,Se=R.__;function Ce(e,t){R.__h&&R.__h(L,e,he||t),he=0;var n=L.__H||(L.__H={__:[],__h:[]});return e>=n.__.length&&n.__.push({}),n.__[e]}function z(e){return he=1,we(je,e)}function we(e,t,n){var r=Ce(I++,2);if(r.t=e,!r.__c&&(r.__=[n?n(t):je(void 0,t),function(e){var t=r.__N?r.__N[0]:r.__[0],n=r.t(t,e);t!==n&&(r.__N=[n,r.__[1]],r.__c.setState({}))}],r.__c=L,!L.__f)){var i=function(e,t,n){if(!r.__c.__H)return!0;var i=!1,o=r.__c.props!==e;if(r.__c.__H.__.some(function(e){if(e.__N){i=!0;var t=e.__[0];e.__=e.__N,e.__N=void 0,t!==e.__[0]&&(o=!0)}}),a){var s=a.call(this,e,t,n);return i?s||o:s}return!i||o};L.__f=!0;var a=L.shouldComponentUpdate,o=L.componentWillUpdate;L.componentWillUpdate=function(e,t,n){if(this.__e){var r=a;a=void 0,i(e,t,n),a=r}o&&o.call(this,e,t,n)},L.shouldComponentUpdate=i}return r.__N||r.__}function Te(e,t){var n=Ce(I++,3);!R.__s&&Ae(n.__H,t)&&(n.__=e,n.u=t,L.__H.__h.push(n))}function Ee(){for(var e;e=ge.shift();){var t=e.__H;if(e.__P&&t)try{t.__h.some(B),t.__h.some(ke),t.__h=[]}catch(n){t.__h=[],R.__e(n,e.__v)}}}R.__b=function(e){L=null,_e&&_e(e)},R.__=function(e,t){e&&t.__k&&t.__k.__m&&(e.__m=t.__k.__m),Se&&Se(e,t)},R.__r=function(e){ve&&ve(e),I=0;var t=(L=e.__c).__H;t&&(pe===L?(t.__h=[],L.__h=[],t.__.some(function(e){e.__N&&(e.__=e.__N),e.u=e.__N=void 0})):(t.__h.some(B),t.__h.some(ke),t.__h=[],I=0)),pe=L},R.diffed=function(e){ye&&ye(e);var t=e.__c;t&&t.__H&&(t.__H.__h.length&&(ge.push(t)!==1&&me===R.requestAnimationFrame||((me=R.requestAnimationFrame)||Oe)(Ee)),t.__H.__.some(function(e){e.u&&=(e.__H=e.u,void 0)})),pe=L=null},R.__c=function(e,t){t.some(function(e){try{e.__h.some(B),e.__h=e.__h.filter(function(e){return!e.__||ke(e)})}catch(n){t.some(function(e){e.__h&&=[]}),t=[],R.__e(n,e.__v)}}),be&&be(e,t)},R.unmount=function(e){xe&&xe(e);var t,n=e.__c;n&&n.__H&&(n.__H.__.some(function(e){try{B(e)}catch(e){t=e}}),n.__H=void 0,t&&R.__e(t,n.__v))};var De=typeof requestAnimationFrame==`function`;function Oe(e){var t,n=function(){clearTimeout(r),De&&cancelAnimationFrame(t),setTimeout(e)},r=setTimeout(n,35);De&&(t=requestAnimationFrame(n))}function B(e){var t=L,n=e.__c;typeof n==`function`&&(e.__c=void 0,n()),L=t}function ke(e){var t=L;e.__c=e.__(),L=t}function Ae(e,t){return!e||e.length!==t.length||t.some(function(t,n){return t!==e[n]})}function je(e,t){return typeof t==`function`?t(e):t}var V=`cairn-rest-token`,Me=class extends Error{};function Ne(e){e?sessionStorage.setItem(V,e):sessionStorage.removeItem(V)}function Pe(){return sessionStorage.getItem(V)!==null}async function H(e,{method:t=`GET`,body:n}={}){let r={Accept:`application/json`},i=sessionStorage.getItem(V);i&&(r.Authorization=`Bearer ${i}`),n!==void 0&&(r[`Content-Type`]=`application/json`);let a;try{a=await fetch(e,{method:t,headers:r,body:n===void 0?void 0:JSON.stringify(n)})}catch{throw Error(`cannot reach cairn at ${window.location.host} (has it stopped?)`)}if(a.status===401)throw new Me(`the REST API needs a bearer token (--rest-token)`);let o=await a.text(),s=null;try{s=o?JSON.parse(o):null}catch{}if(!a.ok){let n=s&&Array.isArray(s.errors)?s.errors.join(`; `):``;throw Error(n||`${t} ${e}: ${a.status} ${a.statusText}`)}return s}var Fe={ms:3e3},Ie={handler:()=>{}};function U(e,t){let[n,r]=z({data:null,error:null}),[i,a]=z(0);return Te(()=>{let t=!0,n=null,i=async()=>{try{let n=await e();t&&r({data:n,error:null})}catch(e){if(!t)return;e instanceof Me&&Ie.handler(),r(t=>({data:t.data,error:e}))}t&&(n=setTimeout(i,Fe.ms))};return i(),()=>{t=!1,clearTimeout(n)}},[...t,i]),[n,()=>a(e=>e+1)]}function W(e){if(e==null||Number.isNaN(e))return`–`;let t=Math.abs(e);return t>=1e9?`${(e/1e9).toFixed(2)}G`:t>=1e6?`${(e/1e6).toFixed(2)}M`:t>=1e4?`${(e/1e3).toFixed(1)}k`:Number.isInteger(e)||t>=100?String(Math.round(e)):e.toFixed(1)}function G(e){if(e==null)return`–`;let t=[`B`,`KiB`,`MiB`,`GiB`,`TiB`],n=e,r=0;for(;n>=1024&&r<t.length-1;)n/=1024,r+=1;return r===0?`${n} B`:`${n.toFixed(1)} ${t[r]}`}function K(e){if(e==null||e<0)return`–`;if(e<1e3)return`${Math.round(e)} ms`;let t=e/1e3;if(t<60)return`${t.toFixed(1)} s`;let n=Math.floor(t/60);if(n<60)return`${n}m ${Math.floor(t%60)}s`;let r=Math.floor(n/60);return r<24?`${r}h ${n%60}m`:`${Math.floor(r/24)}d ${r%24}h`}function q(e){return!e||e<=0?`–`:new Date(e).toISOString().replace(`T`,` `).replace(/\.\d+Z$/,`Z`)}function J(e){return e==null||Number.isNaN(e)?`–`:`${Math.round(e*100)}%`}function Le({state:e}){return F`<span class="state state-${(e||``).toLowerCase()}" data-state=${e}>
    ${e}
  </span>`}function Y({error:e}){return e?F`<p class="error" role="alert">${e.message}</p>`:null}function Re(){let[e]=U(()=>H(`jobs/overview`),[]),t=(e.data&&e.data.jobs||[]).slice().sort((e,t)=>t[`start-time`]-e[`start-time`]);return F`
    <section>
      <h1>Jobs</h1>
      <${Y} error=${e.error} />
      ${e.data&&t.length===0&&F`<p class="muted">No jobs yet.</p>`}
      ${t.length>0&&F`<table class="jobs">
        <thead>
          <tr>
            <th>Name</th><th>State</th><th>Started</th><th>Duration</th><th>Restarts</th>
            <th>Tasks</th><th>Job id</th>
          </tr>
        </thead>
        <tbody>
          ${t.map(e=>F`<tr key=${e.jid} class="job-row" data-jid=${e.jid} data-name=${e.name}>
              <td><a href="#/jobs/${e.jid}/overview">${e.name}</a></td>
              <td><${Le} state=${e.state} /></td>
              <td>${q(e[`start-time`])}</td>
              <td>${K(e.duration)}</td>
              <td>${e.restarts}</td>
              <td>${e.tasks.running}/${e.tasks.total} running</td>
              <td><code>${e.jid}</code></td>
            </tr>`)}
        </tbody>
      </table>`}
    </section>
  `}var ze=250,X=112,Be=90,Ve=28,He=16;function Ue(e){let t=new Map(e.map(e=>[e.id,e])),n=new Map,r=(e,i=new Set)=>{if(n.has(e.id))return n.get(e.id);if(i.has(e.id))return 0;i.add(e.id);let a=(e.inputs||[]).map(e=>t.get(e.id)).filter(Boolean),o=a.length===0?0:1+Math.max(...a.map(e=>r(e,i)));return n.set(e.id,o),o},i=[],a=new Map;for(let t of e){let e=r(t);i[e]=(i[e]||0)+1,a.set(t.id,{col:e,row:i[e]-1})}let o=Math.max(1,...i.filter(Boolean));for(let[e,t]of a){let n=(o-i[t.col])*140/2;a.set(e,{x:He+t.col*340,y:He+n+t.row*140})}return{at:a,width:32+i.length*ze+Math.max(0,i.length-1)*Be,height:32+o*X+(o-1)*Ve}}function We(e){let t=e&&e.subtasks||[],n=e=>Math.max(0,...t.map(t=>t[e]||0));return{level:e&&e.backpressureLevel||`unknown`,ratio:t.length?n(`ratio`):null,busy:t.length?n(`busyRatio`):null}}function Ge({plan:e,vertices:t,backpressure:n}){let r=e&&e.nodes||[];if(r.length===0)return F`<p class="muted">The job has no plan yet.</p>`;let{at:i,width:a,height:o}=Ue(r),s=e=>(t.find(t=>t.id===e)||{}).metrics||{},c=r.flatMap(e=>(e.inputs||[]).filter(e=>i.has(e.id)).map(t=>{let n=i.get(t.id),r=i.get(e.id),a=n.x+ze,o=n.y+X/2,s=r.x,c=r.y+X/2,l=(s-a)/2;return{key:`${t.id}-${e.id}-${t.num}`,path:`M${a},${o} C${a+l},${o} ${s-l},${c} ${s},${c}`,label:t.ship_strategy,lx:(a+s)/2,ly:(o+c)/2-6}}));return F`
    <div class="graph" style=${{width:`${a}px`,height:`${o}px`}}>
      <svg class="edges" width=${a} height=${o}>
        <defs>
          <marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"
            markerHeight="7" orient="auto-start-reverse">
            <path d="M0,0 L10,5 L0,10 z" />
          </marker>
        </defs>
        ${c.map(e=>F`<g key=${e.key}>
            <path class="edge" d=${e.path} marker-end="url(#arrow)" />
            <text class="edge-label" x=${e.lx} y=${e.ly} text-anchor="middle">${e.label}</text>
          </g>`)}
      </svg>
      ${r.map(e=>{let t=i.get(e.id),r=s(e.id),a=We(n[e.id]);return F`
          <div
            key=${e.id}
            class="vertex bp-${a.level}"
            data-vertex-id=${e.id}
            data-vertex-name=${e.description}
            data-backpressure=${a.level}
            style=${{left:`${t.x}px`,top:`${t.y}px`,width:`${ze}px`,height:`${X}px`}}
          >
            <div class="vertex-name" title=${e.description}>${e.description}</div>
            <div class="vertex-row">
              <span>Parallelism <b>${e.parallelism}</b></span>
              <span class="bp-badge">${a.level.toUpperCase()}</span>
            </div>
            <div class="vertex-row">
              <span>In <b>${W(r[`records-in-per-second`])}/s</b></span>
              <span>Out <b>${W(r[`records-out-per-second`])}/s</b></span>
            </div>
            <div class="vertex-row">
              <span>Back-pressured <b>${J(a.ratio)}</b></span>
              <span>Busy <b>${J(a.busy)}</b></span>
            </div>
          </div>
        `})}
    </div>
  `}var Ke=318,qe=160,Z=60,Q=12;function $({title:e,metric:t,points:n,format:r}){let i=n.length,a=Math.max(...n.map(e=>e.y),0),o=a>0?a:1,s=e=>i<=1?183:Z+e*246/(i-1),c=e=>Q+122*(1-e/o),l=n.map((e,t)=>`${s(t).toFixed(1)},${c(e.y).toFixed(1)}`).join(` `);return F`
    <figure class="chart" data-metric=${t} data-points=${i}>
      <figcaption>${e}</figcaption>
      <svg viewBox="0 0 ${Ke} ${qe}" width=${Ke} height=${qe} role="img" aria-label=${e}>
        <line class="axis" x1=${Z} y1=${Q} x2=${Z} y2=${134} />
        <line class="axis" x1=${Z} y1=${134} x2=${306} y2=${134} />
        <line class="grid" x1=${Z} y1=${Q} x2=${306} y2=${Q} />
        <text class="tick" x=${54} y=${16} text-anchor="end">${r(a)}</text>
        <text class="tick" x=${54} y=${138} text-anchor="end">${r(0)}</text>
        ${i>0&&F`<text class="tick" x=${Z} y=${152}>#${n[0].x}</text>
          <text class="tick" x=${306} y=${152} text-anchor="end">#${n[i-1].x}</text>`}
        ${i===0&&F`<text class="empty" x=${189} y=${qe/2} text-anchor="middle">
          no completed checkpoint yet
        </text>`}
        ${i>1&&F`<polyline class="line" points=${l} />`}
        ${n.map((e,t)=>F`<circle class="point" cx=${s(t)} cy=${c(e.y)} r="3">
              <title>checkpoint ${e.x}: ${r(e.y)}</title>
            </circle>`)}
      </svg>
    </figure>
  `}var Je=[`FINISHED`,`CANCELED`,`FAILED`],Ye=[[`overview`,`Overview`],[`checkpoints`,`Checkpoints`],[`exceptions`,`Exceptions`],[`savepoints`,`Savepoints`]];async function Xe(e){for(;;){let t=await H(e);if(t.status&&t.status.id===`COMPLETED`)return t.operation||{};await new Promise(e=>setTimeout(e,500))}}function Ze({jid:e,state:t,onChange:n}){let[r]=U(()=>H(`jobs/${e}/config`),[e]),[i,a]=z(null),[o,s]=z(null),[c,l]=z(!1),u=r.data&&r.data[`execution-config`][`user-config`][`state.savepoints.dir`]||``,d=i===null?u:i,f=Je.includes(t),p=async(e,t)=>{l(!0),s({status:`running`,text:`${e}…`});try{let e=await t();s({status:`ok`,text:e})}catch(t){s({status:`error`,text:`${e} failed: ${t.message}`})}finally{l(!1),n()}},m=t=>p(t?`Stop with savepoint`:`Savepoint`,async()=>{let r=t?{targetDirectory:d||null,drain:!1}:{"target-directory":d||null,"cancel-job":!1},{"request-id":i}=await H(t?`jobs/${e}/stop`:`jobs/${e}/savepoints`,{method:`POST`,body:r});n();let a=await Xe(`jobs/${e}/savepoints/${i}`);return t?`Stopped with a savepoint at ${a.location}`:`Savepoint completed at ${a.location}`});return F`
    <div class="actions">
      <label>
        Savepoint directory
        <input
          name="target-directory"
          placeholder="state.savepoints.dir"
          value=${d}
          onInput=${e=>a(e.target.value)}
          disabled=${f}
        />
      </label>
      <button name="savepoint" onClick=${()=>m(!1)} disabled=${f||c}>
        Trigger savepoint
      </button>
      <button name="stop" onClick=${()=>{window.confirm(`Stop the job with a savepoint? Its sources stop and it ends FINISHED.`)&&m(!0)}} disabled=${f||c}>Stop with savepoint</button>
      <button name="cancel" class="danger" onClick=${()=>{window.confirm(`Cancel the job? It ends CANCELED without a savepoint.`)&&p(`Cancel`,async()=>(await H(`jobs/${e}?mode=cancel`,{method:`PATCH`}),`Cancel requested`))}} disabled=${f||c}>
        Cancel job
      </button>
      ${o&&F`<p class="action-result result-${o.status}" data-status=${o.status}>
        ${o.text}
      </p>`}
    </div>
  `}function Qe({jid:e,job:t}){let n=t.vertices||[],[r]=U(async()=>{let t=await Promise.all(n.map(t=>H(`jobs/${e}/vertices/${t.id}/backpressure`)));return Object.fromEntries(n.map((e,n)=>[e.id,t[n]]))},[e,n.map(e=>e.id).join(`,`)]),i=r.data||{};return F`
    <section>
      <h2>Job graph</h2>
      <${Y} error=${r.error} />
      <div class="graph-scroll">
        <${Ge} plan=${t.plan} vertices=${n} backpressure=${i} />
      </div>
      <h2>Vertices</h2>
      <table class="vertices">
        <thead>
          <tr>
            <th>Name</th><th>Status</th><th>Parallelism</th><th>Records in/s</th>
            <th>Records out/s</th><th>Records received</th><th>Records sent</th>
            <th>Bytes received</th><th>Bytes sent</th><th>Back-pressure</th><th>Busy</th>
          </tr>
        </thead>
        <tbody>
          ${n.map(e=>{let t=e.metrics||{},n=We(i[e.id]);return F`<tr key=${e.id} data-vertex-name=${e.name}>
              <td>${e.name}</td>
              <td><${Le} state=${e.status} /></td>
              <td>${e.parallelism}</td>
              <td>${W(t[`records-in-per-second`])}</td>
              <td>${W(t[`records-out-per-second`])}</td>
              <td>${W(t[`read-records`])}</td>
              <td>${W(t[`write-records`])}</td>
              <td>${G(t[`read-bytes`])}</td>
              <td>${G(t[`write-bytes`])}</td>
              <td><span class="bp-text bp-${n.level}">${n.level.toUpperCase()}</span>
                ${` `}${J(n.ratio)}</td>
              <td>${J(n.busy)}</td>
            </tr>`})}
        </tbody>
      </table>
    </section>
  `}function $e(e){return Math.max(0,...(e.subtasks||[]).map(e=>e.alignment_ms||0))}function et({jid:e}){let[t]=U(()=>H(`jobs/${e}/checkpoints`),[e]),n=t.data;if(!n)return F`<${Y} error=${t.error} />`;let r=(n.history||[]).slice().reverse(),i=e=>r.map(t=>({x:t.id,y:e(t)})),a=n.latest&&n.latest.completed,o=n.counts;return F`
    <section>
      <${Y} error=${t.error} />
      <div class="counts">
        <span>Triggered <b>${o.triggered}</b></span>
        <span>Completed <b data-count="completed">${o.completed}</b></span>
        <span>In progress <b>${o.in_progress}</b></span>
        <span>Failed <b>${o.failed}</b></span>
        <span>Restored <b>${o.restored}</b></span>
      </div>
      <div class="charts">
        <${$} title="Duration" metric="duration" format=${K}
          points=${i(e=>e.end_to_end_duration)} />
        <${$} title="Checkpointed size" metric="size" format=${G}
          points=${i(e=>e.checkpointed_size)} />
        <${$} title="Alignment (slowest subtask)" metric="alignment" format=${K}
          points=${i($e)} />
        <${$} title="In-flight data persisted" metric="in-flight" format=${G}
          points=${i(e=>e.persisted_data)} />
      </div>
      <h2>Latest completed checkpoint${a?` #${a.id}`:``}</h2>
      ${a?F`<p class="muted">
              ${a.checkpoint_type} · ${K(a.end_to_end_duration)} ·
              ${G(a.checkpointed_size)} · ${q(a.latest_ack_timestamp)} ·
              <code>${a.external_path||``}</code>
            </p>
            <table class="subtasks">
              <thead>
                <tr>
                  <th>Task</th><th>Subtask</th><th>Start delay</th><th>Alignment</th>
                  <th>Sync</th><th>Async</th><th>State size</th><th>In-flight</th>
                  <th>Unaligned</th>
                </tr>
              </thead>
              <tbody>
                ${(a.subtasks||[]).map(e=>F`<tr key=${`${e.task}-${e.subtask}`}>
                    <td>${e.task}</td>
                    <td>${e.subtask}</td>
                    <td>${K(e.start_delay_ms)}</td>
                    <td>${K(e.alignment_ms)}</td>
                    <td>${K(e.sync_ms)}</td>
                    <td>${K(e.async_ms)}</td>
                    <td>${G(e.state_size)}</td>
                    <td>${G(e.channel_state_size)}</td>
                    <td>${e.unaligned?`yes`:`no`}</td>
                  </tr>`)}
              </tbody>
            </table>`:F`<p class="muted">None yet.</p>`}
      <h2>History</h2>
      <table class="history">
        <thead>
          <tr>
            <th>Id</th><th>Type</th><th>Triggered</th><th>Duration</th><th>Size</th>
            <th>In-flight</th><th>Subtasks</th>
          </tr>
        </thead>
        <tbody>
          ${(n.history||[]).map(e=>F`<tr key=${e.id}>
              <td>${e.id}</td>
              <td>${e.checkpoint_type}</td>
              <td>${q(e.trigger_timestamp)}</td>
              <td>${K(e.end_to_end_duration)}</td>
              <td>${G(e.checkpointed_size)}</td>
              <td>${G(e.persisted_data)}</td>
              <td>${e.num_acknowledged_subtasks}/${e.num_subtasks}</td>
            </tr>`)}
        </tbody>
      </table>
    </section>
  `}function tt({jid:e,job:t}){let[n]=U(()=>H(`jobs/${e}/exceptions`),[e]),r=n.data&&n.data.exceptionHistory.entries||[],i=Object.entries(t[`restart-causes`]||{});return F`
    <section>
      <${Y} error=${n.error} />
      <p class="counts">
        <span>Restarts <b>${t.restarts}</b></span>
        ${i.map(([e,t])=>F`<span key=${e}>${e} <b>${t}</b></span>`)}
      </p>
      ${n.data&&r.length===0&&F`<p class="muted">No exceptions.</p>`}
      ${r.length>0&&F`<table class="exceptions">
        <thead><tr><th>Time</th><th>Kind</th><th>Restarted</th><th>Cause</th></tr></thead>
        <tbody>
          ${r.map((e,t)=>F`<tr key=${t}>
              <td>${q(e.timestamp)}</td>
              <td>${e.kind}</td>
              <td>${e.restarted?`yes`:`no`}</td>
              <td><pre>${e.stacktrace}</pre></td>
            </tr>`)}
        </tbody>
      </table>`}
    </section>
  `}function nt({jid:e}){let[t]=U(()=>H(`jobs/${e}/checkpoints`),[e]),n=t.data&&t.data.savepoints||[];return F`
    <section>
      <${Y} error=${t.error} />
      ${t.data&&n.length===0&&F`<p class="muted">No savepoint of this job was requested while it ran here.</p>`}
      ${n.length>0&&F`<table class="savepoints">
        <thead><tr><th>Requested</th><th>Kind</th><th>Status</th><th>Location or cause</th></tr></thead>
        <tbody>
          ${n.map(e=>F`<tr key=${e[`request-id`]} class="savepoint" data-status=${e.status}
              data-kind=${e.kind}>
              <td>${q(e.trigger_timestamp)}</td>
              <td>${e.kind===`stop`?`stop with savepoint`:`savepoint`}</td>
              <td>${e.status}</td>
              <td><code>${e.location||e.cause||``}</code></td>
            </tr>`)}
        </tbody>
      </table>`}
    </section>
  `}function rt({jid:e,tab:t}){let[n,r]=U(()=>H(`jobs/${e}`),[e]),i=n.data;if(!i)return F`<section><${Y} error=${n.error} />
      ${!n.error&&F`<p class="muted">Loading job ${e}…</p>`}</section>`;let a=Ye.some(([e])=>e===t)?t:`overview`,o={overview:Qe,checkpoints:et,exceptions:tt,savepoints:nt}[a];return F`
    <section class="job" data-jid=${e}>
      <div class="job-head">
        <h1>${i.name}</h1>
        <${Le} state=${i.state} />
        <span class="muted">
          <code>${e}</code> · started ${q(i[`start-time`])} · ${K(i.duration)} ·
          restarts ${i.restarts}
        </span>
      </div>
      <${Y} error=${n.error} />
      ${i[`failure-cause`]&&F`<p class=${i.state===`FAILED`?`error`:`muted`}>
        ${i.state===`FAILED`?`Failed`:`Last failure (restarted)`}: ${i[`failure-cause`]}
      </p>`}
      <${Ze} jid=${e} state=${i.state} onChange=${r} />
      <nav class="tabs">
        ${Ye.map(([t,n])=>F`<a key=${t} href="#/jobs/${e}/${t}" data-tab=${t}
            class=${t===a?`active`:``}>${n}</a>`)}
      </nav>
      <${o} jid=${e} job=${i} />
    </section>
  `}function it(){let e=window.location.hash.replace(/^#\/?/,``).split(`/`).filter(Boolean);return e[0]===`jobs`&&e[1]?{page:`job`,jid:decodeURIComponent(e[1]),tab:e[2]||`overview`}:{page:`jobs`}}function at(){let[e,t]=z(it);return Te(()=>{let e=()=>t(it());return window.addEventListener(`hashchange`,e),()=>window.removeEventListener(`hashchange`,e)},[]),e}function ot({onToken:e}){let[t,n]=z(``);return F`
    <form class="token-form" onSubmit=${n=>{n.preventDefault(),e(t.trim())}}>
      <h2>This cairn needs a token</h2>
      <p>
        Its REST API was started with <code>--rest-token</code>. Enter the token to see its jobs;
        it is kept in this browser tab only.
      </p>
      ${Pe()&&F`<p class="error">The token given was refused.</p>`}
      <input
        type="password"
        name="token"
        autocomplete="off"
        placeholder="bearer token"
        value=${t}
        onInput=${e=>n(e.target.value)}
      />
      <button type="submit" disabled=${!t.trim()}>Use token</button>
    </form>
  `}function st(){let[e]=U(()=>H(`overview`),[]),t=e.data;return F`
    <header class="top">
      <a class="brand" href="#/">cairn</a>
      <nav><a href="#/">Jobs</a></nav>
      ${t&&F`<span class="cluster">
        ${t[`slots-total`]>0?`workers ${t.taskmanagers} · slots ${t[`slots-available`]}/${t[`slots-total`]} free`:`embedded run`}
        ${` · jobs running ${t[`jobs-running`]}`}
      </span>`}
    </header>
  `}function ct(){let e=at(),[t,n]=z(!1),[r,i]=z(0);return Ie.handler=()=>n(!0),Te(()=>{H(`config`).then(e=>{e&&e[`refresh-interval`]>0&&(Fe.ms=e[`refresh-interval`])}).catch(()=>{})},[r]),t?F`<${ot} onToken=${e=>{Ne(e),n(!1),i(e=>e+1)}} />`:F`
    <div key=${r}>
      <${st} />
      <main>
        ${e.page===`job`?F`<${rt} key=${e.jid} jid=${e.jid} tab=${e.tab} />`:F`<${Re} />`}
      </main>
    </div>
  `}le(F`<${ct} />`,document.getElementById(`app`));
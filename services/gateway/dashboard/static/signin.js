// signin.js: trade a token for a session cookie, then go back where the viewer was headed.

const form = document.getElementById('signin-form');
const token = document.getElementById('token');
const error = document.getElementById('signin-error');
const submit = document.getElementById('signin-submit');

/** Only a path inside the dashboard (never another origin, nor "//host", nor the sign-in page). */
function nextUrl() {
  const next = new URLSearchParams(location.search).get('next') || '';
  if (!next.startsWith('/ui/') || next.startsWith('//') || next.includes('\\')) return '/ui/';
  if (next.startsWith('/ui/signin')) return '/ui/';
  return next;
}

function showError(text) {
  error.textContent = text;
  error.hidden = false;
}

async function problemDetail(res) {
  try {
    const body = await res.json();
    return body.detail || body.title || `Sign-in failed (${res.status}).`;
  } catch {
    return `Sign-in failed (${res.status}).`;
  }
}

async function signIn() {
  const value = token.value.trim();
  if (!value) {
    showError('Enter your token.');
    token.focus();
    return;
  }
  error.hidden = true;
  submit.disabled = true;
  try {
    const res = await fetch('/ui/session', {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify({ token: value }),
    });
    if (res.ok) {
      token.value = '';
      location.assign(nextUrl());
      return;
    }
    showError(await problemDetail(res));
    token.select();
  } catch {
    showError('The gateway could not be reached. Try again.');
  } finally {
    submit.disabled = false;
  }
}

form.addEventListener('submit', (e) => {
  e.preventDefault();
  signIn().catch(() => showError('Sign-in failed.'));
});

/** Where the gateway has an OIDC issuer configured, offer its sign-in too (quietly nothing otherwise). */
async function offerOidc() {
  const res = await fetch('/ui/signin/options', { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  if (!res.ok) return;
  const options = await res.json();
  if (!options || !options.oidc) return;
  const link = document.getElementById('signin-oidc');
  link.href = '/ui/oidc/login?next=' + encodeURIComponent(nextUrl());
  link.parentElement.hidden = false;
}
offerOidc().catch(() => {});

window.addEventListener('unhandledrejection', (e) => { e.preventDefault(); showError(String(e.reason)); });
token.focus();

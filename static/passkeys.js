// Passkeys in the console: registering one (/passkeys) and signing an approval with it
// (/approvals). A static file: the console's CSP forbids inline scripts. The server makes
// every challenge (gateway/signing.py) and verifies every answer; this file only carries
// them between the page and navigator.credentials.
(function () {
  "use strict";
  if (window.egPasskeys) return; // loaded once per page, whatever swaps bring it again
  window.egPasskeys = true;

  function toBytes(b64url) {
    var b64 = b64url.replace(/-/g, "+").replace(/_/g, "/");
    while (b64.length % 4) b64 += "=";
    var raw = atob(b64);
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out.buffer;
  }

  function toB64url(buffer) {
    if (!buffer) return "";
    var bytes = new Uint8Array(buffer);
    var raw = "";
    for (var i = 0; i < bytes.length; i++) raw += String.fromCharCode(bytes[i]);
    return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function csrf(form) {
    var input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function post(url, form, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": csrf(form), "Content-Type": "application/json" },
      body: body === undefined ? "{}" : JSON.stringify(body),
    }).then(function (response) {
      return response.json().then(function (data) {
        if (!response.ok) throw new Error((data.title || "Refused") + ": " + (data.detail || ""));
        return data;
      });
    });
  }

  function say(form, selector, text) {
    var slot = form.querySelector(selector) || document.getElementById(selector.slice(1));
    if (!slot) return;
    slot.textContent = "";
    var p = document.createElement("p");
    p.setAttribute("role", "alert");
    p.className = "note note-danger";
    p.textContent = text;
    slot.appendChild(p);
  }

  function register(form) {
    var name = form.querySelector("input[name=name]");
    post(form.dataset.passkeyOptions, form)
      .then(function (options) {
        options.challenge = toBytes(options.challenge);
        options.user.id = toBytes(options.user.id);
        (options.excludeCredentials || []).forEach(function (c) { c.id = toBytes(c.id); });
        return navigator.credentials.create({ publicKey: options });
      })
      .then(function (credential) {
        return post(form.dataset.passkeyRegister, form, {
          name: name ? name.value : "",
          credential: {
            id: credential.id,
            rawId: toB64url(credential.rawId),
            type: credential.type,
            response: {
              clientDataJSON: toB64url(credential.response.clientDataJSON),
              attestationObject: toB64url(credential.response.attestationObject),
              transports: credential.response.getTransports ? credential.response.getTransports() : [],
            },
            clientExtensionResults: credential.getClientExtensionResults(),
          },
        });
      })
      .then(function () { window.location.reload(); })
      .catch(function (error) { say(form, "#passkey-register-error", String(error.message || error)); });
  }

  function approve(form) {
    var card = form.closest("article");
    var errorSlot = card ? "#" + card.id + "-error" : "#flash";
    post(form.dataset.passkeyApprove, form)
      .then(function (challenge) {
        return navigator.credentials.get({
          publicKey: {
            challenge: toBytes(challenge.challenge),
            rpId: challenge.rp_id,
            allowCredentials: challenge.credential_ids.map(function (id) {
              return { type: "public-key", id: toBytes(id) };
            }),
            userVerification: "required",
            timeout: 60000,
          },
        }).then(function (assertion) { return { challenge: challenge, assertion: assertion }; });
      })
      .then(function (signed) {
        var response = signed.assertion.response;
        var fields = {
          signature: toB64url(response.signature),
          signature_nonce: signed.challenge.nonce,
          signature_key_id: toB64url(signed.assertion.rawId),
          signature_authenticator_data: toB64url(response.authenticatorData),
          signature_client_data_json: toB64url(response.clientDataJSON),
          signature_user_handle: toB64url(response.userHandle),
        };
        Object.keys(fields).forEach(function (name) {
          form.querySelector("input[name=" + name + "]").value = fields[name];
        });
        form.dataset.signed = "true";
        form.requestSubmit();
      })
      .catch(function (error) { say(form, errorSlot, String(error.message || error)); });
  }

  // Capturing, so that the ceremony runs before htmx (or the browser) sends the form; once
  // the assertion is in the form, the second submit goes through as usual.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset.passkeyRegister) {
      event.preventDefault();
      event.stopImmediatePropagation();
      register(form);
    } else if (form.dataset.passkeyApprove && form.dataset.signed !== "true") {
      event.preventDefault();
      event.stopImmediatePropagation();
      if (!form.reportValidity()) return;
      approve(form);
    }
  }, true);

  // After an answer, a form that was refused may be sent again: with a new challenge.
  document.addEventListener("htmx:afterRequest", function (event) {
    var form = event.detail && event.detail.elt;
    if (form && form.dataset && form.dataset.passkeyApprove) delete form.dataset.signed;
  });
})();

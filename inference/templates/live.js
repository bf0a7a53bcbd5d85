document.getElementById('ask').onsubmit = async event => {
  event.preventDefault();
  const status = document.getElementById('status'), text = document.getElementById('input').value;
  status.textContent = 'explaining…';
  try {
    const answer = await fetch('predict', {method: 'POST', headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({texts: [text], explain: true, attention: true})});
    const body = await answer.json();
    if (!answer.ok) { status.textContent = `error ${answer.status}: ${body.error}`; return; }
    status.textContent = body.notes.join(' ');
    show({texts: body.predictions});
  } catch (e) { status.textContent = `no answer from the server: ${e}`; }
};

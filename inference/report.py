"""One self-contained HTML page for explanations (predict.py --explain --html report.html).

Nothing is fetched: the CSS, the script and the data are inline, so the file opens offline and can be mailed. Per
text: label and probabilities, the tokens shaded by one method at a time (the switch at the top: orange supports
the predicted class, blue speaks against it; each method scaled to its own largest |score| in that text), that
text's faithfulness figures (Spearman with occlusion, deletion drops), and the attention heatmap of every layer and
head (query rows × key columns, each map scaled to its own largest weight); hovering a token, or a heatmap row,
outlines that query's row in every map of the text. Texts are HTML-escaped and tokens set as textContent: never markup.

One design, two pages: the cards are drawn in the browser from the JSON objects `predict.py --explain --attention`
prints, embedded in the file (render), or fetched from serve.py's POST /predict by its page at GET / (live_page).
The page is a Jinja template with its style and script beside it (inference/templates/): restyle it there.
"""

from functools import cache
from pathlib import Path

from data.files import write_text
from inference.explain import METHODS

TITLES = {"attention": "attention (last layer)", "rollout": "attention rollout", "grad_x_input": "gradient × input",
          "integrated_gradients": "Integrated Gradients", "occlusion": "occlusion (exact)"}
TEMPLATES = Path(__file__).parent / "templates"  # page.html, its style page.css, its script page.js and live.js


@cache
def template():
    import jinja2

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    # tojson escapes <, >, & and ' (the data cannot close its script tag); keys keep their order (labels, methods).
    environment.policies["json.dumps_kwargs"] = {"sort_keys": False, "ensure_ascii": False}
    return environment.get_template("page.html")


def page(title: str, texts: list[dict], model: dict | None = None) -> str:
    """The one page design: the method switch and a card per text (`texts`: the objects `predict.py --explain
    --attention` prints); with `model` (serve.py's /info model) the live page's text box above them."""
    data = {"methods": list(METHODS), "titles": TITLES, "texts": texts}
    return template().render(title=title, data=data, live=model is not None, model=model)


def render(explanations, title: str = "Why did it predict that?") -> str:
    """The page for a list of inference.explain.Explanation, as a string. Attention at 3 decimals: enough for a
    colour, a sixth of the bytes."""
    return page(title, [e.to_dict(attention=True, decimals=3) for e in explanations])


def live_page(model: dict) -> str:
    """serve.py's page: a text box above the same cards; submitting asks POST /predict for an explanation."""
    return page("Why did it predict that? (live)", [], model)


def write_report(explanations, path) -> None:
    """The page, written atomically (data/files.py): WriteError (one line) leaves an existing page as it was."""
    write_text(path, render(explanations), "report")

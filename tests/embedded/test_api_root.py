"""/api/ and /api/v1/ say where the API is described instead of answering 404."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/api/", "/api/v1/"])
def test_the_api_root_links_the_docs_and_the_schema(client, path):
    response = client.get(path)
    assert response.status_code == 200
    body = response.json()
    assert body["docs"] == "http://testserver/api/docs/"
    assert body["schema"] == "http://testserver/api/schema/"
    assert body["versions"] == {"v1": "http://testserver/api/v1/"}
    # The links lead somewhere.
    assert client.get("/api/schema/").status_code == 200


def test_the_api_root_is_read_only(client):
    assert client.post("/api/v1/").status_code == 405

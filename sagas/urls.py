"""The saga pages of the console, composed under the ``console:`` namespace by gateway.urls."""

from django.urls import URLPattern, path

from sagas import views

console_urlpatterns: list[URLPattern] = [
    path("sagas", views.saga_list, name="sagas"),
    path("sagas/<str:saga_id>", views.saga_detail, name="saga"),
    path(
        "sagas/<str:saga_id>/tasks/<str:task_id>/done",
        views.saga_task_done,
        name="saga-task-done",
    ),
    path("sagas/<str:saga_id>/<slug:action>", views.saga_action, name="saga-action"),
]

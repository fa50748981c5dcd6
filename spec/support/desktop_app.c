/*
** desktop_app: a small X program for the desktop specs, to click on and type into.
**
**   desktop_app            (on $DISPLAY; says what happens on stdout, one line each, flushed)
**
** A white window at (0,0), WIDTH x HEIGHT, with a "button": the square BUTTON_* filled blue,
** green after an odd number of left clicks on it, and under it the text typed so far, in black.
** Lines it writes:
**   ready W H                      mapped, focused and drawn
**   press B X Y / release B X Y    a mouse button (4 and 5 are the wheel), window coordinates
**   clicked N                      the N-th left click inside the button (drawn before the line)
**   key NAME                       a key pressed (its keysym name)
**   text TEXT                      the printable text typed so far (drawn before the line)
** Every line is written after the window shows its new state (XSync), so a screenshot taken once
** a line is seen shows what the line says.
*/
#include <X11/Xlib.h>
#include <X11/Xutil.h>
#include <X11/keysym.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 320
#define HEIGHT 160
#define BUTTON_X 20
#define BUTTON_Y 20
#define BUTTON_W 120
#define BUTTON_H 50
#define MAX_TEXT 200

static Display *dpy;
static Window win;
static GC gc;
static unsigned long white, black, blue, green;
static int clicks = 0;
static char text[MAX_TEXT + 1];
static size_t text_len = 0;

static unsigned long color(const char *name) {
    XColor c, exact;
    if (!XAllocNamedColor(dpy, DefaultColormap(dpy, DefaultScreen(dpy)), name, &c, &exact)) {
        fprintf(stderr, "desktop_app: no color %s\n", name);
        exit(1);
    }
    return c.pixel;
}

static void draw(void) {
    XSetForeground(dpy, gc, white);
    XFillRectangle(dpy, win, gc, 0, 0, WIDTH, HEIGHT);
    XSetForeground(dpy, gc, clicks % 2 ? green : blue);
    XFillRectangle(dpy, win, gc, BUTTON_X, BUTTON_Y, BUTTON_W, BUTTON_H);
    XSetForeground(dpy, gc, black);
    if (text_len > 0) XDrawString(dpy, win, gc, BUTTON_X, BUTTON_Y + BUTTON_H + 30, text, (int)text_len);
    XSync(dpy, False);
}

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static int inside_button(int x, int y) {
    return x >= BUTTON_X && x < BUTTON_X + BUTTON_W && y >= BUTTON_Y && y < BUTTON_Y + BUTTON_H;
}

int main(void) {
    XEvent ev;
    int screen, mapped = 0, ready = 0;
    XSetWindowAttributes attrs;

    dpy = XOpenDisplay(NULL);
    if (dpy == NULL) {
        fprintf(stderr, "desktop_app: cannot open the display\n");
        return 1;
    }
    screen = DefaultScreen(dpy);
    white = color("white");
    black = color("black");
    blue = color("blue");
    green = color("green");
    memset(&attrs, 0, sizeof attrs);
    attrs.background_pixel = white;
    attrs.event_mask = ExposureMask | ButtonPressMask | ButtonReleaseMask | KeyPressMask | StructureNotifyMask;
    win = XCreateWindow(dpy, RootWindow(dpy, screen), 0, 0, WIDTH, HEIGHT, 0, CopyFromParent, InputOutput,
                        CopyFromParent, CWBackPixel | CWEventMask, &attrs);
    XStoreName(dpy, win, "desktop_app");
    gc = XCreateGC(dpy, win, 0, NULL);
    XMapWindow(dpy, win);
    for (;;) {
        XNextEvent(dpy, &ev);
        switch (ev.type) {
        case MapNotify:
            mapped = 1;
            /* no window manager: the window takes the keyboard itself */
            XSetInputFocus(dpy, win, RevertToPointerRoot, CurrentTime);
            break;
        case Expose:
            if (ev.xexpose.count == 0) draw();
            break;
        case ButtonPress:
            say("press %u %d %d", ev.xbutton.button, ev.xbutton.x, ev.xbutton.y);
            if (ev.xbutton.button == Button1 && inside_button(ev.xbutton.x, ev.xbutton.y)) {
                clicks++;
                draw();
                say("clicked %d", clicks);
            }
            break;
        case ButtonRelease:
            say("release %u %d %d", ev.xbutton.button, ev.xbutton.x, ev.xbutton.y);
            break;
        case KeyPress: {
            char buf[16];
            KeySym sym = NoSymbol;
            int i, n = XLookupString(&ev.xkey, buf, sizeof buf, &sym, NULL);
            const char *name = XKeysymToString(sym);
            say("key %s", name ? name : "?");
            for (i = 0; i < n; i++) {
                if ((unsigned char)buf[i] >= 32 && buf[i] != 127 && text_len < MAX_TEXT) text[text_len++] = buf[i];
            }
            if (n > 0) {
                draw();
                text[text_len] = '\0';
                say("text %s", text);
            }
            break;
        }
        default:
            break;
        }
        if (mapped && !ready) {
            ready = 1;
            draw();
            say("ready %d %d", WIDTH, HEIGHT);
        }
    }
}

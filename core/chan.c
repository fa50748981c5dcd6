/* chan.c: the host end of the agent channel; written next. */
static void mc_open_chan(lua_State *L) { (void)L; }
